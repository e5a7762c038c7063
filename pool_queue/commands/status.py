"""pool-status: how far the screen is, how fast it goes, and whether anything looks wrong.

Per step: eligible, done, removed, errors, queued and running items, items/s over the last five
minutes (pauses included: the ETA's rate) and while working (pool-report's items/s), ETA, and the run
package's REMAINING_TOTAL=<n>. Per worker: server, items/s over the last minute, requests in flight,
server health, last error. Per server, what vLLM's own /metrics say about its engine: requests running
and waiting, tokens per engine step, KV cache use, processor-cache hits. --watch refreshes a live view;
--json is for scripts. `rq info` keeps working beside it.
"""

from __future__ import annotations

import itertools
import time

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..cli import load_protocol, number, parser, reports_errors
from ..cli import settings as cli_settings
from ..inputs.items import load_items
from ..jobs.plan import Frameless, frameless_note
from ..observe.prefix_cache import Engine
from ..observe.report import IDLE_GAP_S
from ..observe.status import RunStatus, StatusReader, StepStatus
from ..proc.progress import duration
from ..store.store import Store
from ..text import steps_label


def _n(v: int | None) -> str:
    return "?" if v is None else f"{v:,}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def idle(step: StepStatus) -> bool:
    """Work left, and no live worker takes the step: nothing moves, whatever the last rate was."""
    return step.workers == 0 and step.remaining > 0


def step_rate(step: StepStatus) -> str:
    """The 5-minute rate while a live worker takes the step (with none, the last rows' rate only falls)."""
    return "-" if step.workers == 0 else f"{step.items_per_s_5m:.1f}"


def working_rate(step: StepStatus) -> str:
    """Items per second over the step's busy time, as pool-report computes its items/s."""
    return "-" if step.items_per_s_working is None else f"{step.items_per_s_working:.1f}"


def rates_line(st: RunStatus) -> str:
    """Each rate's window in words, and the rate pool-report prints, so two figures that differ say why."""
    working = ", ".join(f"step {s.step} {working_rate(s)}" for s in st.steps)
    return (f"/s 5m: a step's items of the last 5 min (since its first row, if later) per second, pauses included "
            f"(the ETA's rate); while working, as pool-report's items/s (pauses over {IDLE_GAP_S:g} s left out): "
            f"{working}")  # fmt: skip


def eta(step: StepStatus, unknown: str = "unknown") -> str:
    """The step's ETA; `unknown` while Redis does not answer (the table's `?`, as its queue columns say it):
    whether any worker still takes the step is unknown, and the last rows' rate would count down for a
    screen that stopped."""
    if step.eligible and not step.remaining:
        return "done"
    if step.workers is None:
        return unknown
    return "no workers" if idle(step) else duration(step.eta_s)


def _table(title: str | None, cols: tuple[str, ...], right: bool = True) -> Table:
    """A table that fits 80 columns: one space between columns, long values wrap instead of being cut."""
    t = Table(box=box.SIMPLE_HEAD, title=title, padding=0, show_edge=False)  # the box's blank rules part the columns
    for col in cols:
        t.add_column(col, justify="right" if right else "left", overflow="fold")
    return t


def render(st: RunStatus) -> Group:
    clock = time.strftime("%H:%M:%S", time.localtime(st.at))
    head = Text(f"pool-status {clock}  screen {st.screen or '-'}  {st.results}", overflow="fold")
    steps = _table(
        None, ("step", "eligible", "done", "%", "removed", "errors", "queued", "running", "/s 5m", "ETA", "cache")
    )
    for step in st.steps:
        steps.add_row(
            str(step.step),
            f"{step.eligible:,}",
            f"{step.done:,}",
            f"{100 * step.done / step.eligible:.1f}" if step.eligible else "-",
            f"{step.removed:,}",
            f"[red]{step.errors:,}[/]" if step.errors else "0",
            _n(step.queued_items),
            _n(step.running_items),
            step_rate(step),
            "-" if idle(step) else eta(step, unknown="?"),
            _pct(step.prefix_cache_hit_rate),
        )
    parts: list[Table | Text | str] = [head, steps, Text(rates_line(st))]
    parts.append("cache: vLLM prefix-cache hits (share of prompt tokens)")
    parts += [Text(line) for line in frameless_lines(st)]
    if stalled := [str(s.step) for s in st.steps if idle(s)]:
        parts.append(f"[yellow]step {', '.join(stalled)}: work left and no workers, so no ETA[/]")
    if st.redis_error:
        parts.append(f"[red]Redis unreachable: {st.redis_error}[/] (queue columns unknown)")
    if st.failed:
        failed = _table(
            f"{len(st.failed)} job(s) failed for good (pool-enqueue --retry-failed)", ("step", "job", "reason"), False
        )
        for f in st.failed[:10]:
            failed.add_row(str(f.step), f.job_id, f.reason.strip().splitlines()[-1][:100] if f.reason.strip() else "")
        parts.append(failed)
    if st.other_screens:
        parts.append(f"other screens in this Redis: {', '.join(st.other_screens)}")
    if not st.workers:
        if not st.redis_error:
            parts.append("no live workers (none started, or all stopped)")
        return Group(*parts)
    workers = _table(
        f"{len(st.workers)} worker(s)", ("worker", "steps", "/s 1m", "in flight", "server", "errors"), False
    )
    for w in st.workers:
        up = {True: "[green]up[/]", False: "[red]DOWN[/]", None: "?"}[w.health if w.health is not None else w.server_up]
        rate, load = f"{w.items_per_s:.1f}", in_flight_cell(w.inflight, w.inflight_cost, w.max_inflight)
        workers.add_row(f"{w.name}\n{w.server}", ",".join(map(str, w.steps)), rate, load, up, str(w.errors))
    parts.append(workers)
    parts.append("/s 1m: a worker's items of the last minute (since it started, if later) per second")
    if any(w.inflight > round(w.inflight_cost) for w in st.workers):
        parts.append(
            "in flight: what the forwards cost the server against the bound, in forwards; a batch's "
            "siblings reuse its frames and cost about one frame each, so more are sent (in brackets)"
        )
    if st.servers:
        engines = _table("the servers' engines (vLLM's /metrics)",
                         ("server", "steps", "running", "waiting", "tokens/step", "KV", "mm cache"), False)  # fmt: skip
        for v in st.servers:
            engines.add_row(v.server, ",".join(map(str, v.steps)), *engine_cells(v.engine))
        parts.append(engines)
    if unread := sorted({w.server for w in st.workers} - {v.server for v in st.servers}):
        said = (f"no engine view of {', '.join(unread)} yet: none of its workers has reported a read of its /metrics "
                "(none comes where a server exports no request counts)")  # fmt: skip
        parts.append(Text(said, overflow="fold"))
    parts += [Text(f"{w.name} takes no work: {w.held}", overflow="fold") for w in st.workers if w.held]
    parts += [Text(f"last error of {w.name}: {w.last_error}", overflow="fold") for w in st.workers if w.last_error]
    return Group(*parts)


def engine_cells(e: Engine) -> tuple[str, str, str, str, str]:
    """Running and waiting requests, mean tokens per engine step since the read before, KV cache use, the
    processor cache's hits ("-": not exported by the server's release, or no step since)."""
    step = "-" if e.tokens_per_step is None else f"{e.tokens_per_step:,.0f}"
    return f"{e.running:.0f}", f"{e.waiting:.0f}", step, _pct(e.kv_cache_usage), _pct(e.processor_cache_hit_rate)


def in_flight_cell(sent: int, cost: float, bound: int) -> str:
    """A worker's in-flight bound as it holds it, by cost (`workers.slots`), and the forwards sent where they
    are more: a batch's siblings cost little, so a worker at its bound may have many more at the server."""
    held = f"{round(cost)}/{bound}"
    return held if sent <= round(cost) else f"{held} ({sent} sent)"


def frameless_lines(st: RunStatus) -> list[str]:
    """Why a step's eligible items fall short of the survivors of the step before: those without frames."""
    last = st.steps[-1].step if st.steps else 0
    return [frameless_note(Frameless(s.no_frames - s.no_frames_other, s.no_frames_other), p.step, s.step, last)
            for p, s in itertools.pairwise(st.steps) if s.no_frames]  # fmt: skip


def plain_lines(st: RunStatus) -> str:
    """One line per step, for --watch into a log or a pipe (a live view would print nothing there)."""
    clock = time.strftime("%H:%M:%S", time.localtime(st.at))
    workers = "?" if st.redis_error else len(st.workers)
    lines = [
        f"{clock} step {s.step}: done {s.done:,}/{s.eligible:,}, removed {s.removed:,}, errors {s.errors:,}, "
        f"{_queue(st, s)}, {step_rate(s)}/s over 5m, {working_rate(s)}/s while working, ETA {eta(s)}, "
        f"prefix-cache hits {_pct(s.prefix_cache_hit_rate)}; workers {workers}"
        for s in st.steps
    ]
    for v in st.servers:
        running, waiting, step, kv, mm = engine_cells(v.engine)
        lines.append(f"{clock} {v.server} ({steps_label(v.steps)}): {running} running, {waiting} waiting, "
                     f"{step} tokens/step, KV {kv}, mm cache {mm}")  # fmt: skip
    if st.redis_error:
        lines.append(f"{clock} Redis unreachable: {st.redis_error} (queues and workers unknown)")
    return "\n".join(lines)


def _queue(st: RunStatus, step: StepStatus) -> str:
    if st.redis_error:
        return "queue unknown"
    return f"queued {_n(step.queued_items)}, running {_n(step.running_items)}"


def remaining_lines(st: RunStatus) -> str:
    return "\n".join(f"STEP={s.step} REMAINING_TOTAL={s.remaining}" for s in st.steps)


@reports_errors
def main(argv: list[str] | None = None) -> None:
    p = parser("pool-status", __doc__ or "")
    p.add_argument(
        "--watch",
        nargs="?",
        const=5.0,
        type=number(float, 0.0, above=True),
        metavar="SECONDS",
        help="live view (default every 5 s)",
    )
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.add_argument("--no-health", action="store_true", help="do not probe the servers' /health")
    args = p.parse_args(argv)
    settings = cli_settings(args)
    protocol = load_protocol(settings)
    store = Store(settings.results_dir, protocol.fingerprint, named=settings.results_named())
    if settings.origin("results") is not None and not store.root.exists():  # a typo would read as nothing done
        store.require_screen("show")
    store.check_stamp()
    items = load_items(settings.items_dir, settings.root_named())
    conn = settings.redis()
    reader = StatusReader(items, store, settings.frames_dir, conn, protocol, probe_health=not args.no_health)

    def read() -> RunStatus:
        """The status; a Redis that does not answer named with its address and where that came from (a `.env`)."""
        st = reader.read()
        if st.redis_error:
            st.redis_error = f"{settings.redis_said()}: {st.redis_error}"
        return st

    if args.json:
        print(read().model_dump_json(indent=2))
        return
    con = Console()
    if not args.watch:
        st = read()
        con.print(render(st))
        print(remaining_lines(st))
        return
    try:
        if not con.is_terminal:  # a log or a pipe: plain lines per refresh
            while True:
                print(plain_lines(read()), flush=True)
                time.sleep(args.watch)
        with Live(render(read()), console=con, refresh_per_second=1, screen=False) as live:
            while True:
                time.sleep(args.watch)
                live.update(render(read()))
    except KeyboardInterrupt:
        pass
