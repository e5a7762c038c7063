"""A worker with faults put in from outside, for fault runs: `python tests/harness/faulty_worker.py
[--clock-skew-s S] [--fault-items ID,ID] WORKER-ARGS...` patches this process, then runs pool-worker's
own `main` with the rest of the arguments. The production worker knows nothing of either fault.

--clock-skew-s: this node's wall clock runs S seconds off. What the process reads as wall-clock time
moves: `time.time` (rows' timestamps, presence) and the timestamps RQ writes into its registries.
Redis's clock, which the leases use, does not move.

--fault-items: screening these items raises inside the worker, on the item's own path, after its request
was prepared: the worker's own handling of a bug of ours (an `internal` row for that item, the chunk goes
on) is what runs. An item named here is kept out of batch requests, so its fault costs no batch fallback.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import rq.executions
import rq.registry
import rq.utils

from pool_queue.rows import Row
from workers.main import main
from workers.screen import Item, Screener


def command(*faults: str) -> list[str]:
    """The start of a worker's command line under this wrapper, with its faults (`--clock-skew-s 120`)."""
    return [sys.executable, str(Path(__file__).resolve()), *faults]


def skew_clock(skew_s: float) -> None:
    real_time, real_stamp = time.time, rq.utils.current_timestamp
    time.time = lambda: real_time() + skew_s
    for mod in (rq.registry, rq.executions):
        mod.current_timestamp = lambda: real_stamp() + int(skew_s)  # type: ignore[attr-defined]


def fail_items(ids: frozenset[str]) -> None:
    """Items in `ids` take their own path (never a batch), and judging their answers raises."""
    group, judge = Screener.screen_group, Screener._judge

    async def screen_group(self: Screener, step: int, items: list[Item]) -> list[Row]:
        rest = [it for it in items if it.item_id not in ids]
        rows = await group(self, step, rest) if rest else []
        hit = [it for it in items if it.item_id in ids]
        return rows + list(await asyncio.gather(*(self.screen(step, it) for it in hit)))

    def failing_judge(self: Screener, step: int, item: Item, *args: Any) -> Row:
        if item.item_id in ids:
            raise RuntimeError("injected fault (tests/harness/faulty_worker.py)")
        return judge(self, step, item, *args)

    Screener.screen_group = screen_group  # type: ignore[method-assign]
    Screener._judge = failing_judge  # type: ignore[method-assign,assignment]


def run(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__)
    p.add_argument("--clock-skew-s", type=float, default=0.0)
    p.add_argument("--fault-items", default="", help="comma-separated item ids")
    args, rest = p.parse_known_args(argv)
    if args.clock_skew_s:
        skew_clock(args.clock_skew_s)
    if ids := frozenset(x.strip() for x in args.fault_items.split(",") if x.strip()):
        fail_items(ids)
    main(rest)


if __name__ == "__main__":
    run()
