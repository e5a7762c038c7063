"""Redis from the worker's event loop: calls run in a thread, and an outage is waited out, not fatal.

While Redis is away the worker keeps its in-flight forwards going and its rows on disk; the calls
that need Redis (take a job, acknowledge one) wait here and go on once it answers again. One line
is logged when an outage begins and one when it ends; past `wait_s` the worker gives up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import redis

from pool_queue.errors import RedisGone
from pool_queue.proc.progress import duration

from .waiting import Note, Stop

T = TypeVar("T")
FULL = "is at its maxmemory and refuses writes (OOM: raise maxmemory; docs/scale.md, Redis, says how much)"
# A full Redis takes some writes as RQ's keys expire, then refuses again: it is back once a refused call went
# through and nothing was refused for a while (the worker passes three heartbeats), so one episode is one line
# and one "back" line.
FULL_SETTLE_S = 15.0
log = logging.getLogger(__name__)
# Waited out: Redis away, loading, or at its maxmemory refusing writes (a transaction refused whole).
OUTAGE = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, redis.OutOfMemoryError)


class RedisLink:
    def __init__(self, where: str, wait_s: float, who: str, note_s: float = 60.0, settle_s: float = FULL_SETTLE_S):
        self.where = where
        self.wait_s = wait_s
        self.who = who
        self.note_s = note_s
        self.settle_s = settle_s
        self.down_since: float | None = None
        self.note: Note | None = None  # the outage's once-a-minute line, whichever calls wait it out
        self.refused: set[object] = set()  # calls Redis refused at its maxmemory: only one of them through ends it
        self.through: float | None = None  # when a refused call went through: the full Redis settles from then
        # Its own threads: heartbeats must never queue behind frame encoding in the default executor,
        # or a busy step-3 worker misses its leases and its jobs are run twice.
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="redis")

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    @property
    def up(self) -> bool:
        return self.down_since is None

    async def call(self, fn: Callable[..., T], *args: object, stop: Stop | None = None) -> T:
        """`fn(*args)` in a thread, repeated while Redis is unreachable (up to `wait_s`). A call that guards
        no work in flight (taking a job, starting) passes `stop`: the first signal ends its wait (Stopped)."""
        pause_s = 0.2
        while True:
            sent = time.monotonic()
            try:
                out = await self._run(fn, *args)
            except redis.AuthenticationError:
                raise  # a wrong password: no wait would help (cli.reports_errors names it, exit 2)
            except OUTAGE as e:
                self._down(e, fn)
                assert self.down_since is not None
                if time.monotonic() - self.down_since > self.wait_s:
                    raise RedisGone(f"Redis at {self.where} did not answer for {self.wait_s:.0f} s: {e}") from e
                assert self.note is not None
                self.note.tick()
                await (stop.sleep(pause_s) if stop is not None else asyncio.sleep(pause_s))
                pause_s = min(2 * pause_s, 2.0)
                continue
            self._up(fn, sent)
            return out

    async def attempt(self, fn: Callable[..., T], *args: object) -> T | None:
        """`fn(*args)` once; None while Redis is unreachable (heartbeats, presence: the next one will do)."""
        sent = time.monotonic()
        try:
            out = await self._run(fn, *args)
        except redis.AuthenticationError:
            raise
        except OUTAGE as e:
            self._down(e, fn)
            return None
        self._up(fn, sent)
        return out

    def _down(self, e: Exception, fn: object) -> None:
        if isinstance(e, redis.OutOfMemoryError):
            self.refused.add(fn)
            self.through = None
        if self.down_since is None:
            self.down_since = time.monotonic()
            self.note = Note(self.who, f"Redis at {self.where}", f"gives up after {duration(self.wait_s)}", self.note_s)
            what = FULL if isinstance(e, redis.OutOfMemoryError) else f"unreachable ({type(e).__name__})"
            log.warning(
                "%s: Redis at %s %s; in-flight work goes on, rows stay on disk; waiting up to %.0f s",
                self.who,
                self.where,
                what,
                self.wait_s,
            )

    def _up(self, fn: object, sent: float) -> None:
        """An answer to a call sent after the outage began ends it: a call sent before (the link runs two at
        once) may have been answered just before Redis went, and says nothing of now. A full Redis answers
        reads, so only a call it refused before, now through, ends that one (heartbeats and rescues come round
        again, so one always does), once no call was refused for `settle_s` after it."""
        if self.down_since is None or sent < self.down_since:
            return
        now = time.monotonic()
        if self.refused:
            if fn in self.refused and self.through is None:
                self.through = now
            if self.through is None or now - self.through < self.settle_s:
                return
        gone_s = (self.through or now) - self.down_since
        log.warning("%s: Redis at %s is back after %.1f s", self.who, self.where, gone_s)
        self.down_since = self.through = None
        self.refused.clear()
