"""Keep workers running: one that exits unexpectedly is started again, with backoff, and logged.

Exit codes 2 and 3 mean the worker's configuration is wrong (bad arguments, a server serving the
wrong model): starting it again cannot help, so it stays down and says why in its log. Every
other exit (a crash, SIGKILL, Redis gone past its wait) is restarted after 1, 2, 4 ... 60 s; a
worker that then ran for `healthy_s` starts over at 1 s. Under `burst`, exit 0 means "no work
left": the worker is started again only while chained work of ours still shows up.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

FATAL = (2, 3)


@dataclass
class _Child:
    start: Callable[[], subprocess.Popen[bytes]]
    steps: tuple[int, ...]
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restarts: int = 0
    delay_s: float = 0.0
    due: float | None = None  # when a restart is due
    done: bool = False  # exited 0 under burst, or exited with a fatal code
    codes: list[int] = field(default_factory=list)


class Supervisor:
    def __init__(
        self,
        burst: bool,
        log: Callable[[str], None],
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        healthy_s: float = 120.0,
    ) -> None:
        self.burst = burst
        self.log = log
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.healthy_s = healthy_s
        self.children: dict[str, _Child] = {}

    def add(self, name: str, start: Callable[[], subprocess.Popen[bytes]], steps: tuple[int, ...] = ()) -> None:
        """A worker process of these steps."""
        child = _Child(start, steps)
        self.children[name] = child
        self._start(child)

    def _start(self, child: _Child) -> None:
        child.proc = child.start()
        child.started = time.monotonic()
        child.due = None
        child.done = False

    def step(self, work_left: Callable[[list[int]], bool]) -> bool:
        """Look after every worker once; False when none runs or will run again. `work_left(steps)`: whether
        these steps still have work, asked only for the steps of workers that can run (one that stopped on a
        configuration error takes no more work: its step's jobs are left for another launch to name)."""
        now = time.monotonic()
        for name, child in self.children.items():
            if child.due is not None and now >= child.due:
                child.restarts += 1
                self.log(f"{name}: starting again (restart {child.restarts})")
                self._start(child)
            if child.proc is None or child.due is not None or child.done:
                continue
            rc = child.proc.poll()
            if rc is None:
                continue
            child.codes.append(rc)
            if rc in FATAL:
                self.log(f"{name}: exited with {rc} (a configuration error; see its log): not restarted")
                child.done = True
            elif rc == 0 and self.burst:
                child.done = True
            else:
                ran = now - child.started
                child.delay_s = self.backoff_s if ran >= self.healthy_s or not child.delay_s else child.delay_s * 2
                child.delay_s = min(child.delay_s, self.max_backoff_s)
                child.due = now + child.delay_s
                self.log(
                    f"{name}: exited unexpectedly with {rc} after {ran:.0f} s; restarting in {child.delay_s:.0f} s"
                )
        idle = [c for c in self.children.values() if c.done and c.codes and c.codes[-1] == 0]
        able = [c for c in self.children.values() if not (c.done and c.codes[-1] in FATAL)]
        if idle and len(idle) == len(able):
            if not work_left(sorted({s for c in able for s in c.steps})):
                return False
            for child in idle:  # a burst worker left while a chained step of ours still had work: again
                self._start(child)
        return any(not c.done for c in self.children.values())

    def running(self) -> list[subprocess.Popen[bytes]]:
        return [c.proc for c in self.children.values() if c.proc is not None and c.proc.poll() is None]

    def exit_codes(self) -> list[int]:
        """Each worker's last exit code (after the caller stopped the running ones)."""
        out = []
        for child in self.children.values():
            rc = child.proc.poll() if child.proc is not None and child.due is None and not child.done else None
            out.append(rc if rc is not None else (child.codes[-1] if child.codes else 0))
        return out
