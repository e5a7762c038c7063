"""A node whose wall clock is off, for fault runs (POOL_CLOCK_SKEW_S, tests only).

What this process reads as wall-clock time moves by the skew: `time.time` (rows' timestamps, presence)
and the timestamps RQ writes into its registries. Redis's clock, which the leases use, does not move.
"""

from __future__ import annotations

import time

import rq.executions
import rq.registry
import rq.utils


def skew(seconds: float) -> None:
    real_time, real_stamp = time.time, rq.utils.current_timestamp
    time.time = lambda: real_time() + seconds
    for mod in (rq.registry, rq.executions):
        mod.current_timestamp = lambda: real_stamp() + int(seconds)  # type: ignore[attr-defined]
