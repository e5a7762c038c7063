"""Worker presence in Redis: each worker publishes a short-lived snapshot that pool-status reads.

One key per worker (`pool:worker:<name>`, expiring after TTL_S), so a worker that dies drops out
of the view by itself. Nothing here matters for correctness: the store is the truth, RQ the work.
Snapshots are JSON validated by pydantic on the way out of Redis, never unpickled.
"""

from __future__ import annotations

import socket
import time
from collections import deque
from collections.abc import Callable

from pydantic import BaseModel, ValidationError
from redis import Redis

from .prefix_cache import Engine

PREFIX = "pool:worker:"
TTL_S = 30
FIND_S = 5.0  # how often a launcher looks for the keys of its workers it has not found yet


class WorkerSnapshot(BaseModel):
    name: str
    screen: str  # the screen whose queues it takes
    server: str
    steps: list[int]
    host: str
    pid: int
    max_inflight: int
    inflight: int  # forwards sent and not yet answered
    # what they cost the server, in forwards (the in-flight bound's unit, `workers.slots`): a batch's siblings cost
    # about one frame's worth each, so more forwards than max_inflight may be at the server
    inflight_cost: float = 0.0
    active_jobs: int
    items: int
    forwards: int
    errors: int
    removed: int
    retries: int
    items_per_s: float  # over the last minute
    forwards_per_s: float
    outage_s: float  # time spent waiting for a server that was down
    server_up: bool  # the worker's last request to the server got an answer
    held: str | None = None  # why it takes no new work now (a silent server, rows it cannot write)
    hold_lines: list[str] = []  # the last lines its log said as a hold began or ended (`HoldNews`)
    hold_said: int = 0  # such lines since it started, so a reader knows how many it has not seen
    last_error: str | None = None
    metrics_url: str | None = None
    engine: Engine | None = None  # its server's engine at the worker's last read of the server's /metrics
    started_at: float
    updated_at: float


class RateWindow:
    """Items and forwards per second over the last minute, from one sample per heartbeat (so a worker's
    rate in pool-status follows what it does now, not its average since start)."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self.samples: deque[tuple[float, int, int]] = deque(maxlen=64)  # (time, items, forwards)

    def rates(self, now: float, items: int, forwards: int) -> tuple[float, float]:
        self.samples.append((now, items, forwards))
        t0, i0, f0 = next((s for s in self.samples if now - s[0] <= self.window_s), self.samples[0])
        dt = now - t0
        return ((items - i0) / dt, (forwards - f0) / dt) if dt > 0 else (0.0, 0.0)


def publish(conn: Redis, snap: WorkerSnapshot) -> None:
    conn.set(PREFIX + snap.name, snap.model_dump_json(), ex=TTL_S)


def withdraw(conn: Redis, name: str) -> None:
    conn.delete(PREFIX + name)


def read_all(conn: Redis) -> list[WorkerSnapshot]:
    keys = sorted(conn.scan_iter(match=PREFIX + "*", count=1000))
    out = []
    for raw in conn.mget(keys) if keys else []:
        if raw is None:
            continue  # expired between SCAN and MGET
        try:
            out.append(WorkerSnapshot.model_validate_json(raw))
        except ValidationError:
            continue  # a snapshot of another version: not ours to show
    return sorted(out, key=lambda s: (s.server, s.name))


class HoldNews:
    """A launcher's console hears its workers' holds: each line a worker's log says as a hold begins or ends,
    said once, in order. Read from the workers' presence keys, not their log files: the disk that refuses a
    worker's rows may refuse its log lines too, and Redis is where a held worker goes on reporting. Each
    snapshot keeps the last lines and counts them all, so a hold that begins and ends between two looks
    is still said; a worker publishes at once when a line is said (`workers.runtime`). A worker that exits
    while it was last seen held is said to have done so (its key goes with it)."""

    def __init__(self, conn: Redis, say: Callable[[str], None]) -> None:
        self.conn = conn
        self.say = say
        self._key: dict[int, str] = {}  # a worker process of this host (pid) -> its presence key
        self._said: dict[str, int] = {}  # presence key -> how many of its hold lines were said
        self._held: dict[str, str] = {}  # presence key -> why it was held when last seen
        self._found_at = -FIND_S

    def look(self, pids: list[int]) -> None:
        """Say the hold lines that these worker processes (this host's, started by the caller) said since the
        last look. A key not found yet is looked for every FIND_S (a SCAN of the keys); found ones are read
        with one MGET."""
        for pid in [p for p in self._key if p not in pids]:
            key = self._key.pop(pid)
            if key in self._held:
                self.say(f"{key.removeprefix(PREFIX)}: exited; it was held when last seen ({self._held.pop(key)})")
        if any(pid not in self._key for pid in pids) and time.monotonic() - self._found_at >= FIND_S:
            self._found_at = time.monotonic()
            host = socket.gethostname()
            self._key |= {s.pid: PREFIX + s.name for s in read_all(self.conn) if s.host == host and s.pid in pids}
        keys = sorted(set(self._key.values()))
        for key, raw in zip(keys, self.conn.mget(keys) if keys else [], strict=True):
            try:
                snap = WorkerSnapshot.model_validate_json(raw) if raw is not None else None
            except ValidationError:
                snap = None
            if snap is None:
                continue
            new = min(snap.hold_said - self._said.get(key, 0), len(snap.hold_lines))
            for line in snap.hold_lines[len(snap.hold_lines) - new :] if new > 0 else []:
                self.say(f"{snap.name}: {line}")
            self._said[key] = snap.hold_said
            if snap.held:
                self._held[key] = snap.held
            else:
                self._held.pop(key, None)
