"""The bound on what the forwards in flight to one server cost it, taken a request at a time."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

UNIT = 1_000_000  # costs are kept in millionths of a forward: whole numbers, so what is given back is exact


class Slots:
    """`size` forwards' worth of work in flight at most, give or take one request.

    A request (a forward, or a batch of conversations) says what it costs the server, in forwards: a
    forward 1, a batch the forwards whose frames the server must encode and prefill plus its siblings'
    text (`screen.batch_cost`). Requests are admitted first come, first served, while what is in flight
    costs less than `size`. So a request starts as soon as any work can, a batch overshoots the bound by
    less than its own cost, nothing waits for room that a larger request needs (no deadlock), and a large
    batch at the head of the line goes in at the next release, whatever small requests come after it (no
    starvation). Taking a batch's cost as its conversations count would hold the server's pipe idle:
    its siblings, served from what the first conversation's frames filled, cost the server little, yet the
    batch is answered only with its slowest conversation.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._bound = size * UNIT
        self._held = 0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def held(self) -> float:
        """What the requests in flight cost, in forwards."""
        return self._held / UNIT

    @contextlib.asynccontextmanager
    async def take(self, cost: float = 1.0) -> AsyncIterator[None]:
        units = max(0, round(cost * UNIT))
        if self._waiting or self._held >= self._bound:
            granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (units, granted)
            self._waiting.append(entry)
            try:
                await granted
            except asyncio.CancelledError:
                if granted.cancelled():
                    with contextlib.suppress(ValueError):  # _wake may have dropped it already
                        self._waiting.remove(entry)
                    self._wake()  # the next in line may start now
                else:
                    self._give(units)  # granted just as it was cancelled: its cost goes back
                raise
        else:
            self._held += units
        try:
            yield
        finally:
            self._give(units)

    def _give(self, units: int) -> None:
        self._held -= units
        self._wake()

    def _wake(self) -> None:
        while self._waiting and self._held < self._bound:
            units, granted = self._waiting.popleft()
            if not granted.cancelled():
                self._held += units
                granted.set_result(None)
