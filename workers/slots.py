"""The bound on forwards in flight to one server, taken a batch at a time."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator


class Slots:
    """`size` forwards in flight at most; a batch request of k conversations holds k slots.

    A batch takes its k slots at once, first come first served: taken one by one, two batches each
    holding part of what they need could wait on each other for ever, and a large batch behind a stream
    of single forwards would never start.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.free = size
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    @contextlib.asynccontextmanager
    async def take(self, k: int = 1) -> AsyncIterator[None]:
        k = min(k, self.size)  # callers split larger batches; a larger one would wait for ever
        if self._waiting or self.free < k:
            granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (k, granted)
            self._waiting.append(entry)
            try:
                await granted
            except asyncio.CancelledError:
                if granted.cancelled():
                    with contextlib.suppress(ValueError):  # _wake may have dropped it already
                        self._waiting.remove(entry)
                    self._wake()  # the next in line may fit now
                else:
                    self._give(k)  # granted just as it was cancelled: the slots go back
                raise
        else:
            self.free -= k
        try:
            yield
        finally:
            self._give(k)

    def _give(self, k: int) -> None:
        self.free += k
        self._wake()

    def _wake(self) -> None:
        while self._waiting:
            k, granted = self._waiting[0]
            if not granted.cancelled():
                if k > self.free:
                    return
                self.free -= k
                granted.set_result(None)
            self._waiting.popleft()
