"""Worker presence in Redis: each worker publishes a short-lived snapshot that pool-status reads.

One key per worker (`pool:worker:<name>`, expiring after TTL_S), so a worker that dies drops out
of the view by itself. Nothing here matters for correctness: the store is the truth, RQ the work.
Snapshots are JSON validated by pydantic on the way out of Redis, never unpickled.
"""

from __future__ import annotations

from collections import deque

from pydantic import BaseModel, ValidationError
from redis import Redis

from .prefix_cache import Engine

PREFIX = "pool:worker:"
TTL_S = 30


class WorkerSnapshot(BaseModel):
    name: str
    screen: str  # the screen whose queues it takes
    server: str
    steps: list[int]
    host: str
    pid: int
    max_inflight: int
    inflight: int  # forwards sent and not yet answered
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
