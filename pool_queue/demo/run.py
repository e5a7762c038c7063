"""pool-demo's screen: a synthetic pool (generated once, its size kept beside it), an embedded Redis, simulated
servers (two 8B, one 2B), one worker each, all three steps chained and watched to their end with progress
bars, then the summary table, the audit, the report and the commands that work on the demo. `--fresh` moves an
older run's results aside first (`fresh`)."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc
from redis import Redis
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from ..cli import exe, fail
from ..inputs.items import ItemSet, load_items
from ..jobs.plan import eligible, frameless_notes
from ..jobs.queue import Screen, screen_of
from ..jobs.steps import check_frames, run_steps
from ..observe.audit import run_audit, summary
from ..observe.markdown import write_report
from ..observe.report import step_report
from ..proc.hostlock import hold
from ..proc.procs import Procs, free_port, wait_health
from ..proc.progress import busy_time, console, duration
from ..protocol import Protocol
from ..settings import DEMO_ENV_MARK, default_results, demo_env_root, load_settings, redis_data
from ..store.store import Store
from .synth import SynthConfig, build_root, generate

SHAPE = ".pool-demo.json"  # the pool's size as generated: flags that ask for another size are refused
DEFAULT_SHAPE = {"items": 2000, "videos": 300}


@dataclass(frozen=True)
class Demo:
    """What pool-demo was asked for: its root, the size of a new pool, the simulated GPUs' speed-up, whether
    to start fresh, whether videos without frames are meant to be missing, and how often a line of progress
    goes to output that is not a terminal."""

    root: Path
    items: int | None = None
    videos: int | None = None
    speed: float = 4.0
    fresh: bool = False
    allow_missing_frames: bool = False
    progress_every: float = 5.0


def _pool(demo: Demo, con: Console) -> None:
    """Generate the pool, or check that the one there is the size asked for (one line if not, exit 2)."""
    asked = {k: v for k, v in (("items", demo.items), ("videos", demo.videos)) if v is not None}
    if not (demo.root / "items").exists():
        shape = {**DEFAULT_SHAPE, **asked}
        con.print(f"generating a synthetic pool in {demo.root} ({shape['items']} items, {shape['videos']} videos)...")

        def make(folder: Path) -> None:  # written beside the root, renamed into place when complete
            generate(folder, SynthConfig(n_items=shape["items"], n_videos=shape["videos"]))
            (folder / SHAPE).write_text(json.dumps(shape))

        try:
            build_root(demo.root, make, con.print)
        except KeyboardInterrupt:  # no process was started yet, and no pool is left to resume
            con.print(f"interrupted while generating: {demo.root} was not made; `pool-demo` generates it again")
            raise SystemExit(130) from None
        return
    try:
        have = json.loads((demo.root / SHAPE).read_text())
    except (OSError, ValueError):
        have = None  # a pool the demo did not make: it is screened as it is
    if asked and (have is None or any(have.get(k) != v for k, v in asked.items())):
        size = f"{have['items']} items and {have['videos']} videos" if have else "a pool the demo did not make"
        flags = " and ".join(f"--{k}" for k in asked)
        verb = "applies" if len(asked) == 1 else "apply"
        fail(f"{demo.root} already holds {size}: {flags} {verb} to a new pool; pass --root NEWDIR, or delete it")


def _fresh(root: Path, results: Path, con: Console) -> None:
    """The older run's rows, report and queue move aside together, said in one line: the run that follows,
    and every later `pool-demo`, is the fresh one, its queue empty."""
    aside = results.with_name(f"{results.name}-{time.strftime('%Y%m%dT%H%M%S')}")
    moves = [(results, aside), (_report_dir(results), _report_dir(aside))]
    moves.append((redis_data(root, results), redis_data(root, aside)))
    if not [src.rename(dst) for src, dst in moves if src.exists()]:
        return
    con.print(f"--fresh: the older results moved to {aside} (their report and queue beside them)", highlight=False)


def _report_dir(results: Path) -> Path:
    """results/pool -> results/report, results/pool-<time> -> results/report-<time>."""
    return results.parent / f"report{results.name.removeprefix('pool')}"


def run_demo(demo: Demo, con: Console) -> None:
    """The whole screen of the pool at `demo.root` (generated first if absent), watched to its end, then its table,
    audit, report and the commands that work on it."""
    hold("pool-demo", demo.root)  # a second demo would screen the same items again on the same queue
    _pool(demo, con)
    item_set = load_items(demo.root / "items")  # a root whose items do not load fails here: nothing started or written
    results = default_results(demo.root)
    protocol = Protocol()
    meant = demo.allow_missing_frames or None  # a root the demo did not make may lack frames
    check_frames(load_settings(root=demo.root, results=results, allow_missing_frames=meant), protocol,
                 sorted(protocol.steps), items=item_set)  # fmt: skip
    if demo.fresh:
        _fresh(demo.root, results, con)
    store = Store(
        results, protocol.fingerprint, protocol.model_dump(mode="json"), f"the default under --root {demo.root}"
    )
    store.claim()
    log_dir = demo.root / "logs" / "demo"
    with Procs(log_dir) as procs:
        redis_url = procs.redis(free_port(), redis_data(demo.root, results), aof=True)  # a rerun resumes its queue
        speed = ["--speed", str(demo.speed)]
        sims = [
            procs.sim("sim8b-0", free_port(), "--profile", "qwen3-vl-8b", *speed),
            procs.sim("sim8b-1", free_port(), "--profile", "qwen3-vl-8b", *speed),
            procs.sim("sim2b-0", free_port(), "--profile", "qwen3-vl-2b", *speed),
        ]
        for url in sims:
            wait_health(url, 30)
        common = ["--root", str(demo.root), "--results", str(results), "--redis-url", redis_url]
        settings = load_settings(root=demo.root, results=results, redis_url=redis_url)
        run_steps(settings, protocol, sorted(protocol.steps), plan_only=False, frames_checked=True)
        env = _point_env_here(demo.root, results, redis_url, con)  # the root loaded and its work is queued: it is whole
        print(_commands(demo.root, results, redis_url, env, live=True), flush=True)  # whole lines: they are copied
        for i, url in enumerate(sims):
            procs.start(f"worker-{i}", [sys.executable, "-m", "workers.main", "--server", url, *common])
        con.print(f"workers started (logs in {log_dir}); screening...")
        screen = screen_of(store, Redis.from_url(redis_url))
        assert screen is not None  # the store was claimed above
        _watch(
            procs, protocol, screen, store, item_set, demo.root / "frames" / "pool_frames", log_dir, demo.progress_every
        )
    title = f"demo screen of {item_set.items.num_rows} items"
    t = Table("step", "done", "removed", "errors", "wall", "items/s", title=title)
    for step in sorted(protocol.steps):
        rep = step_report(step, store, item_set)  # the report's numbers: its items done, its items/s while working
        rate = "-" if rep.items_per_s is None else f"{rep.items_per_s:.1f}"
        t.add_row(str(step), str(rep.done), str(rep.n_removed), str(rep.n_errors), busy_time(rep.wall_s), rate)
    con.print(t)
    frames = demo.root / "frames" / "pool_frames"
    for line in frameless_notes(protocol, item_set.items, store, frames):
        con.print(line, highlight=False)
    con.print(f"rows in {results}")
    # the demo screens every step to its end: an unfinished one is a problem, and each finding is shown
    checked = run_audit(
        results, protocol, item_set, frames, show=False, tar_dir=demo.root / "frames_tar", complete=True
    )
    con.print(summary(checked), highlight=False)
    report = write_report(store, item_set, protocol, _report_dir(results), frames)
    con.print(f"report with plots: {report}")
    print(_commands(demo.root, results, redis_url, env, live=False), flush=True)


def _watch(
    procs: Procs,
    protocol: Protocol,
    screen: Screen,
    store: Store,
    item_set: ItemSet,
    frames: Path,
    log_dir: Path,
    every_s: float,
) -> None:
    """Progress bars with ETA per step until the queues stay empty; a child that dies stops the demo. Into a
    log or a pipe, where the bars show nothing until the end, a plain line every `every_s` instead."""
    items = item_set.items
    plain = not console.is_terminal
    t0 = said = time.monotonic()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
    ) as prog:
        tasks = {s: prog.add_task(f"step {s}", total=None) for s in sorted(protocol.steps)}
        idle = 0
        while idle < 3:
            time.sleep(1.0)
            counts = {}
            for step in tasks:
                elig = eligible(protocol, step, items, store, frames).column("item_id")
                done = (
                    pc.sum(pc.is_in(elig, value_set=store.settled(step))).as_py() or 0
                )  # done as pool-status counts it
                counts[step] = done, len(elig)
                prog.update(tasks[step], total=counts[step][1], completed=counts[step][0])
            if plain and time.monotonic() - said >= every_s:
                said = time.monotonic()
                steps = ", ".join(f"step {s} {done:,}/{total:,}" for s, (done, total) in counts.items())
                console.print(f"screening {duration(said - t0)}: {steps} done", highlight=False)
            for name, proc in procs.children.items():
                if proc.poll() is not None:
                    raise SystemExit(f"{name} exited with {proc.returncode}: see {log_dir / (name + '.log')}")
            idle = idle + 1 if not screen.busy(tasks) else 0


def _point_env_here(root: Path, results: Path, redis_url: str, con: Console) -> Path | None:
    """A `.env` here so that the bare commands find the demo; never over a file the demo did not write. Written
    once the root is whole (generated, loaded, its work queued), and said in one line, naming the demo root an
    older demo's file pointed at: it changes what every bare command in this folder reaches."""
    env = Path(".env")
    before = demo_env_root(env) if env.exists() else None
    if env.exists() and before is None:
        return None
    pinned = "" if results.resolve() == default_results(root).resolve() else f"POOL_RESULTS={results.resolve()}\n"
    env.write_text(f"{DEMO_ENV_MARK}POOL_ROOT={root.resolve()}\n{pinned}REDIS_URL={redis_url}\n")
    outside = "" if env.resolve().is_relative_to(root.resolve()) else f", outside the demo root {root}"
    was = f" (it pointed at {before})" if before is not None and before != root.resolve() else ""
    con.print(f"wrote {env.resolve()}{outside}{was}: bare pool-* commands in this folder reach this demo's root and "
              "Redis; delete it to stop that", highlight=False, soft_wrap=True)  # fmt: skip
    return env.resolve()


def _commands(root: Path, results: Path, redis_url: str, env: Path | None, live: bool) -> str:
    """The exact commands that work on this demo, in a fresh shell too."""
    flags = f"--root {root} --results {results}"
    lines = [f"demo Redis: {redis_url}" + ("" if live else " (stopped with the demo)")]
    if live:
        lines += [
            f"  {exe('rq')} info -u {redis_url} --serializer rq.serializers.JSONSerializer",
            f"  {exe('pool-status')} --watch {flags} --redis-url {redis_url}",
        ]
    lines += [f"  {exe(c)} {flags}" for c in ("pool-status", "pool-report")]
    lines.append(f"  {exe('pool-export')} {flags} --out demo-export")
    if env is not None and not live:  # while it runs, the line that wrote it said so
        lines.append(f"{env} points bare commands here at the demo (`pool-status`, `pool-report`...)")
    return "\n".join(lines)
