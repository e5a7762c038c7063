"""pool-demo: the whole screen on this machine: synthetic pool, embedded Redis, simulated vLLM servers
(two 8B, one 2B), one worker per server, all three steps chained, live progress with ETA, summary.

Every process it starts is stopped on exit: Ctrl-C, SIGTERM and SIGHUP alike stop the workers first (their
jobs finish), then the servers and Redis, and exit with 128 + the signal's number. Run again, it resumes:
its Redis keeps an append-only file under the demo folder, and every step that has work is enqueued (as
`pool-enqueue --step all` does), so the rows already on disk are kept and the rest is screened.
`--fresh` moves the older results (rows, report, queue) aside and starts empty; the next run resumes the
fresh one. One demo runs on a root at a time (a second is refused, naming the first).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from rich.console import Console

from ..cli import Parser, add_allow_missing_frames, number, reports_errors
from ..demo.run import DEFAULT_SHAPE, Demo, run_demo
from ..proc.procs import Interrupted, interrupt_on_stop_signals


@reports_errors
def main(argv: list[str] | None = None) -> None:
    p = Parser(prog="pool-demo", description=__doc__)
    p.add_argument("--root", type=Path, default=Path("demo-pool"), help="package root (generated if absent)")
    p.add_argument("--items", type=number(int, 1), help=f"items of a new pool (default {DEFAULT_SHAPE['items']})")
    p.add_argument("--videos", type=number(int, 1), help=f"videos of a new pool (default {DEFAULT_SHAPE['videos']})")
    p.add_argument(
        "--speed",
        type=number(float, 0.0, above=True),
        default=4.0,
        help="simulated GPUs run this many times faster than an H200 (default 4)",
    )
    p.add_argument(
        "--fresh", action="store_true", help="move the older results aside and screen again from empty (keep the pool)"
    )
    p.add_argument(
        "--progress-every",
        type=number(float, 0.0),  # 0: a line at every look (each second)
        default=5.0,
        metavar="S",
        help="output not on a terminal: a line this often",
    )
    add_allow_missing_frames(p)
    args = p.parse_args(argv)
    con = Console()
    interrupt_on_stop_signals()
    try:
        run_demo(
            Demo(
                args.root,
                args.items,
                args.videos,
                args.speed,
                args.fresh,
                args.allow_missing_frames,
                args.progress_every,
            ),
            con,
        )
    except KeyboardInterrupt as e:  # every process was stopped on the way out; the rows stay
        with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
            con.print("interrupted: the demo's processes are stopped; its rows stay, and `pool-demo` resumes them")
        raise SystemExit(e.exit_code if isinstance(e, Interrupted) else 130) from None
