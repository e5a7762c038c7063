"""Why a worker takes no new work for now: its server went silent, or its rows cannot be written.

Either way the worker gives its leased jobs back to the queue (other workers run them), keeps the rows
it already wrote, and probes until the cause clears: one line when a hold begins, one when it ends. A
hold's probe tries what the refused operation needs (a write: `SegmentWriter.fits`), so it clears exactly
when that would go through. The lines are kept too (`said`, the last few, and how many in all), published
with the worker's presence, so the launcher that started the worker says them on its console as well.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .waiting import Note

log = logging.getLogger(__name__)
KEPT_LINES = 8  # the last lines a worker publishes for its launcher (presence.HoldNews)


@dataclass
class _Hold:
    why: str
    back: str  # what is true again when it clears, said with how long it took
    probe: Callable[[], Awaitable[bool]]
    note: Note  # said again once a minute while it lasts; its start is the hold's


class Holds:
    def __init__(self, who: str, note_s: float = 60.0) -> None:
        self.who = who
        self.note_s = note_s
        self._on: dict[str, _Hold] = {}
        self.said: deque[str] = deque(maxlen=KEPT_LINES)  # the last lines said, without the worker's name
        self.n_said = 0  # lines said since the worker started: a reader that missed some knows how many

    def __bool__(self) -> bool:
        return bool(self._on)

    def __contains__(self, kind: str) -> bool:
        return kind in self._on

    def begin(self, kind: str, why: str, back: str, probe: Callable[[], Awaitable[bool]]) -> bool:
        """Start a hold (said once; a hold already on is left as it is). True when it is new."""
        if kind in self._on:
            return False
        self._on[kind] = _Hold(why, back, probe, Note(self.who, f"the hold to clear ({why})", "no bound", self.note_s))
        self._say(f"{why}: its jobs go back to the queue; no new work until that clears")
        return True

    async def clear(self) -> bool:
        """Probe each hold once; True when none is left."""
        for kind, h in list(self._on.items()):
            if await h.probe():
                del self._on[kind]
                self._say(f"{h.back} after {time.monotonic() - h.note.since:.0f} s: taking work again")
            else:
                h.note.tick()
        return not self._on

    def _say(self, line: str) -> None:
        log.warning("%s: %s", self.who, line)
        self.said.append(line)
        self.n_said += 1

    def describe(self) -> str | None:
        """What holds the worker now, for pool-status."""
        return "; ".join(h.why for h in self._on.values()) or None
