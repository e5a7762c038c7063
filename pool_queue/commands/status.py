"""pool-status: how far the screen is, how fast it goes, and whether anything looks wrong.

Per step: eligible, done, removed, errors, queued and running items, items/s over the last
minute and five minutes, ETA, and the run package's REMAINING_TOTAL=<n>. Per worker: server,
rate, requests in flight, server health, last error. --watch refreshes a live view; --json is
for scripts. `rq info` keeps working beside it.
"""

from __future__ import annotations

import time

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from ..items import ItemsError, load_items
from ..status import RunStatus, StatusReader
from ..store import Store, StoreError
from ._cli import fail, load_protocol, parser, settings


def duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    if s >= 86400:
        return f"{s // 86400}d {s % 86400 // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 60}m {s % 60:02d}s"


def _n(v: int | None) -> str:
    return "?" if v is None else f"{v:,}"


def render(st: RunStatus) -> Group:
    at = st.at
    steps = Table(
        box=box.SIMPLE_HEAD,
        title=f"pool-status  {st.results}  screen {st.screen or '-'}  {time.strftime('%H:%M:%S', time.localtime(at))}",
    )
    for col in ("step", "eligible", "done", "%", "removed", "errors", "queued", "running", "/s 1m", "/s 5m", "ETA"):
        steps.add_column(col, justify="right", no_wrap=True)
    for s in st.steps:
        steps.add_row(
            str(s.step),
            f"{s.eligible:,}",
            f"{s.done:,}",
            f"{100 * s.done / s.eligible:.1f}" if s.eligible else "-",
            f"{s.removed:,}",
            f"[red]{s.errors:,}[/]" if s.errors else "0",
            _n(s.queued_items),
            _n(s.running_items),
            f"{s.items_per_s_1m:.1f}",
            f"{s.items_per_s_5m:.1f}",
            "done" if s.eligible and not s.remaining else duration(s.eta_s),
        )
    parts: list[Table | str] = [steps]
    if st.redis_error:
        parts.append(f"[red]Redis unreachable: {st.redis_error}[/] (queue columns unknown)")
    if st.failed:
        title = f"{len(st.failed)} job(s) failed for good (pool-enqueue --retry-failed)"
        failed = Table(box=box.SIMPLE_HEAD, title=title)
        for col in ("step", "job", "reason"):
            failed.add_column(col)
        for f in st.failed[:10]:
            failed.add_row(str(f.step), f.job_id, f.reason.strip().splitlines()[-1][:100] if f.reason.strip() else "")
        parts.append(failed)
    if st.other_screens:
        parts.append(f"other screens in this Redis: {', '.join(st.other_screens)}")
    workers = Table(box=box.SIMPLE_HEAD, title=f"{len(st.workers)} worker(s)")
    for col in ("worker", "server", "steps", "items/s", "in flight", "server", "errors", "last error"):
        workers.add_column(col)
    for w in st.workers:
        up = {True: "[green]up[/]", False: "[red]DOWN[/]", None: "?"}[w.health if w.health is not None else w.server_up]
        workers.add_row(
            w.name,
            w.server,
            ",".join(map(str, w.steps)),
            f"{w.items_per_s:.1f}",
            f"{w.inflight}/{w.max_inflight}",
            up,
            str(w.errors),
            (w.last_error or "")[:80],
        )
    parts.append(workers if st.workers else "no live workers (none started, or all stopped)")
    return Group(*parts)


def remaining_lines(st: RunStatus) -> str:
    return "\n".join(f"STEP={s.step} REMAINING_TOTAL={s.remaining}" for s in st.steps)


def main(argv: list[str] | None = None) -> None:
    p = parser("pool-status", __doc__ or "")
    p.add_argument("--watch", nargs="?", const=5.0, type=float, metavar="SECONDS", help="live view (default every 5 s)")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.add_argument("--no-health", action="store_true", help="do not probe the servers' /health")
    a = p.parse_args(argv)
    s = settings(a)
    protocol = load_protocol(s)
    store = Store(s.results_dir, protocol.fingerprint)
    try:
        store.check_stamp()
        items = load_items(s.items_dir)
    except (StoreError, ItemsError) as e:
        fail(str(e))
    conn = s.redis()
    reader = StatusReader(items, store, s.frames_dir, conn, probe_health=not a.no_health)
    if a.json:
        print(reader.read().model_dump_json(indent=2))
        return
    con = Console()
    if not con.is_terminal:
        con = Console(width=max(con.width, 140))  # logs and pipes: never truncate the numbers
    if not a.watch:
        st = reader.read()
        con.print(render(st))
        print(remaining_lines(st))
        return
    with Live(render(reader.read()), console=con, refresh_per_second=1, screen=False) as live:
        try:
            while True:
                time.sleep(a.watch)
                live.update(render(reader.read()))
        except KeyboardInterrupt:
            pass
