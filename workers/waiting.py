"""The worker's waits (Redis, its server, a hold) as a person sees them: stopped by the first signal when
nothing is in flight, and said again once a minute while they last, so no wait is silent or unstoppable.

`Stop` is the process's SIGTERM/SIGINT: the first ends every wait that guards no work and lets jobs in
flight finish; a second leaves at once (exit 130: leases expire and the jobs run again elsewhere).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable

from pool_queue.proc.progress import duration

log = logging.getLogger(__name__)


class Stopped(Exception):
    """A signal ended a wait that guarded no work in flight."""


class Stop:
    def __init__(self, who: str = "pool-worker") -> None:
        self.who = who
        self.event = asyncio.Event()
        self.in_flight: Callable[[], int] = lambda: 0  # jobs that the first signal lets finish

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal)

    def __bool__(self) -> bool:
        return self.event.is_set()

    def _on_signal(self) -> None:
        if self.event.is_set():
            raise SystemExit(130)  # second signal: leave now, leases expire and jobs return
        n = self.in_flight()
        if n:
            log.info("%s: signal received: no new jobs; finishing %d job(s) in flight", self.who, n)
        else:
            log.info("%s: signal received: nothing in flight, stopping", self.who)
        self.event.set()

    async def sleep(self, wait_s: float) -> None:
        """Sleep, or raise Stopped as soon as the signal comes."""
        if self.event.is_set():
            raise Stopped
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.event.wait(), wait_s)
            raise Stopped


class Note:
    """One line every `every_s` while a wait lasts: what it waits for, how long so far, and its bound."""

    def __init__(self, who: str, what: str, bound: str, every_s: float) -> None:
        self.who, self.what, self.bound, self.every_s = who, what, bound, every_s
        self.since = self.last = time.monotonic()

    def tick(self) -> None:
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            log.warning(
                "%s: still waiting for %s: %s so far, %s", self.who, self.what, duration(now - self.since), self.bound
            )
