"""A screen at a glance: per step what is eligible, done, removed, failed, queued, running, how fast,
and when it ends; per worker its server, rate and health.

Built to be re-read every few seconds at full scale: the store's index is incremental and kept in
memory, the item table is loaded once, job sizes are cached (job ids are content hashes, so a job
id always holds the same items), and per-worker figures come from one Redis key per worker.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.compute as pc
import redis
from pydantic import BaseModel
from rq.job import Job
from rq.serializers import JSONSerializer

from . import presence
from .items import ItemSet
from .plan import MAX_ITEM_RUNS, eligible
from .queue import step_queue
from .store import STEPS, Store

WINDOWS_S = (60, 300)


class StepStatus(BaseModel):
    step: int
    eligible: int
    done: int  # settled: ok, permanently failed, or out of re-attempts
    ok: int
    removed: int
    errors: int  # items whose winning row is an error
    remaining: int  # eligible - done: the run package's REMAINING_TOTAL
    queued_jobs: int | None  # None: Redis unreachable
    queued_items: int | None
    running_jobs: int | None
    running_items: int | None
    items_per_s_1m: float
    items_per_s_5m: float
    eta_s: float | None  # remaining / the 5-minute rate; None when nothing moves


class WorkerStatus(presence.WorkerSnapshot):
    health: bool | None = None  # /health of its server answered 200 just now


class RunStatus(BaseModel):
    at: float
    results: str
    steps: list[StepStatus]
    workers: list[WorkerStatus]
    redis_error: str | None = None


@dataclass
class StatusReader:
    items: ItemSet
    store: Store
    frames_dir: Path
    conn: redis.Redis
    probe_health: bool = True
    _job_sizes: dict[str, int] = field(default_factory=dict)

    def read(self) -> RunStatus:
        now = time.time()
        redis_error = None
        queues: dict[int, tuple[int, int, int, int]] = {}
        workers: list[WorkerStatus] = []
        try:
            for step in STEPS:
                queues[step] = self._queue(step)
            workers = [WorkerStatus(**w.model_dump()) for w in presence.read_all(self.conn)]
        except redis.RedisError as e:
            redis_error = str(e)
        if self.probe_health and workers:
            health = asyncio.run(_probe({w.server for w in workers}))
            for w in workers:
                w.health = health[w.server]
        steps = [self._step(step, now, queues.get(step)) for step in STEPS]
        return RunStatus(at=now, results=str(self.store.root), steps=steps, workers=workers, redis_error=redis_error)

    def _step(self, step: int, now: float, q: tuple[int, int, int, int] | None) -> StepStatus:
        elig = eligible(step, self.items.items, self.store, self.frames_dir).column("item_id")
        w = self.store.winners(step)
        w = w.filter(pc.is_in(w.column("item_id"), value_set=elig))
        ok = pc.equal(w.column("status"), "ok")
        done = pc.sum(pc.is_in(elig, value_set=self.store.final_ids(step, MAX_ITEM_RUNS))).as_py() or 0
        finished = w.column("finished_at")
        rates = [_count(pc.greater_equal(finished, now - win)) / _span(finished, now, win) for win in WINDOWS_S]
        remaining = len(elig) - done
        return StepStatus(
            step=step,
            eligible=len(elig),
            done=done,
            ok=_count(ok),
            removed=_count(pc.and_(ok, pc.fill_null(w.column("removed"), False))),
            errors=w.num_rows - _count(ok),
            remaining=remaining,
            queued_jobs=q[0] if q else None,
            queued_items=q[1] if q else None,
            running_jobs=q[2] if q else None,
            running_items=q[3] if q else None,
            items_per_s_1m=rates[0],
            items_per_s_5m=rates[1],
            eta_s=remaining / rates[1] if rates[1] > 0 and remaining else None,
        )

    def _queue(self, step: int) -> tuple[int, int, int, int]:
        q = step_queue(self.conn, step)
        waiting = [j.decode() if isinstance(j, bytes) else j for j in self.conn.lrange(q.key, 0, -1)]
        running = q.started_job_registry.get_job_ids()
        return len(waiting), self._items_in(waiting), len(running), self._items_in(running)

    def _items_in(self, job_ids: list[str]) -> int:
        missing = [j for j in job_ids if j not in self._job_sizes]
        for b in range(0, len(missing), 500):
            part = missing[b : b + 500]
            for jid, job in zip(
                part, Job.fetch_many(part, connection=self.conn, serializer=JSONSerializer), strict=True
            ):
                self._job_sizes[jid] = len(job.args[1]) if job is not None else 0
        return sum(self._job_sizes[j] for j in job_ids)


def _count(mask: pa.ChunkedArray | pa.Array) -> int:
    return int(pc.sum(pc.fill_null(mask, False)).as_py() or 0)


def _span(finished: pa.ChunkedArray, now: float, window: float) -> float:
    """The window, or less when the step began inside it (so a young step's rate is not diluted)."""
    first = pc.min(finished).as_py() if len(finished) else None
    return max(1.0, min(window, now - first)) if first is not None else window


async def _probe(servers: set[str]) -> dict[str, bool]:
    async with httpx.AsyncClient(timeout=2.0) as http:

        async def one(url: str) -> bool:
            try:
                return (await http.get(url.rstrip("/") + "/health")).status_code == 200
            except httpx.HTTPError:
                return False

        found = await asyncio.gather(*(one(s) for s in sorted(servers)))
    return dict(zip(sorted(servers), found, strict=True))
