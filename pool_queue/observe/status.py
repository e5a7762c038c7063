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

from ..inputs.items import ItemSet
from ..jobs.plan import eligible, frameless, reachable
from ..jobs.queue import Screen, other_screens, screen_of
from ..protocol import Protocol
from ..store.store import Store
from . import prefix_cache, presence
from .report import step_rows, working_rate

WINDOWS_S = (60, 300)


class StepStatus(BaseModel):
    step: int
    eligible: int
    done: int  # settled: ok, permanently failed, or out of re-attempts
    ok: int
    removed: int
    errors: int  # items whose winning row is an error
    no_frames: int = 0  # survivors of the step before whose video has no frames: never screened here (plan.frameless)
    no_frames_other: int = 0  # of those, of videos that are not `k:`: their folder belongs in the cache
    remaining: int  # the run package's REMAINING_TOTAL: eligible - done, plus what may still become eligible
    queued_jobs: int | None  # None: Redis unreachable
    queued_items: int | None  # eligible items still to do whose job waits (disjoint from done and running)
    running_jobs: int | None
    running_items: int | None  # eligible items still to do whose job runs now
    failed_jobs: int | None  # failed for good (RQ's failed registry); pool-enqueue --retry-failed re-runs them
    items_per_s_1m: float  # the step's rows finished in the last minute (or since its first row), pauses included
    items_per_s_5m: float  # the same over five minutes: the ETA's rate
    items_per_s_working: float | None = None  # over the step's busy time: pool-report's items/s (report.working_rate)
    eta_s: float | None  # remaining / the 5-minute rate; None when nothing moves or no worker is known to take it
    workers: int | None = None  # live workers taking this step (None: Redis unreachable)
    prefix_cache_hit_rate: float | None = None  # vLLM's, over the step's prompt tokens (prefix_cache.py)


class WorkerStatus(presence.WorkerSnapshot):
    health: bool | None = None  # /health of its server answered 200 just now


class ServerStatus(BaseModel):
    """A model server as vLLM's own /metrics show it, from its workers' latest read."""

    server: str
    steps: list[int]  # the steps its workers take
    engine: prefix_cache.Engine


class FailedJob(BaseModel):
    job_id: str
    step: int
    reason: str


class RunStatus(BaseModel):
    at: float
    results: str
    screen: str | None  # this results root's id in Redis (None before anything was enqueued or run)
    steps: list[StepStatus]
    workers: list[WorkerStatus]
    servers: list[ServerStatus] = []  # the servers whose workers read an engine view from their /metrics
    failed: list[FailedJob] = []
    other_screens: list[str] = []  # other screens sharing this Redis
    redis_error: str | None = None


@dataclass
class StatusReader:
    items: ItemSet
    store: Store
    frames_dir: Path
    conn: redis.Redis
    protocol: Protocol
    probe_health: bool = True
    _job_items: dict[str, pa.Array] = field(default_factory=dict)

    def read(self) -> RunStatus:
        now = time.time()
        redis_error = None
        queues: dict[int, Held] = {}
        workers: list[WorkerStatus] = []
        failed: list[FailedJob] = []
        others: list[str] = []
        screen = screen_of(self.store, self.conn)
        try:
            if screen is not None:
                jobs = screen.snapshot(sorted(self.protocol.steps))
                held = {j for q in jobs.values() for j in (*q.waiting, *q.moving, *q.running)}
                self._job_items = {j: a for j, a in self._job_items.items() if j in held}  # ended jobs drop out
                for step, q in jobs.items():
                    waiting = [*q.waiting, *q.moving]
                    queues[step] = Held(
                        len(waiting),
                        self._items_in(screen, waiting),
                        len(q.running),
                        self._items_in(screen, q.running),
                        len(q.failed),
                    )
                    failed += [FailedJob(job_id=j, step=step, reason=r) for j, r in q.failed.items()]
                live = presence.read_all(self.conn)
                workers = [WorkerStatus(**w.model_dump()) for w in live if w.screen == screen.id]
            others = other_screens(self.conn, screen.id if screen else "")
        except redis.AuthenticationError:
            raise  # not an outage: the command says so (cli.reports_errors)
        except redis.RedisError as e:
            redis_error = str(e)
        if self.probe_health and workers:
            health = asyncio.run(_probe({w.server for w in workers}))
            for w in workers:
                w.health = health[w.server]
        cache = prefix_cache.read(self.store.root)
        idle = Held(0, _NONE, 0, _NONE, 0) if screen is None else None
        taking = None if redis_error else {s: sum(s in w.steps for w in workers) for s in self.protocol.steps}
        steps: list[StepStatus] = []
        for step in sorted(self.protocol.steps):
            open_before = bool(steps) and steps[-1].remaining > 0  # then this step's total is an upper bound
            taken = taking[step] if taking else None
            steps.append(self._step(step, now, queues.get(step, idle), cache.get(step), taken, open_before))
        return RunStatus(
            at=now,
            results=str(self.store.root),
            screen=screen.id if screen else None,
            steps=steps,
            workers=workers,
            servers=servers(workers),
            failed=failed,
            other_screens=others,
            redis_error=redis_error,
        )

    def _step(
        self,
        step: int,
        now: float,
        in_queue: Held | None,
        cache: prefix_cache.StepCache | None,
        workers: int | None,
        open_before: bool,
    ) -> StepStatus:
        elig = eligible(self.protocol, step, self.items.items, self.store, self.frames_dir).column("item_id")
        winners = self.store.winners(step)
        winners = winners.filter(pc.is_in(winners.column("item_id"), value_set=elig))
        ok = pc.equal(winners.column("status"), "ok")
        held = in_queue or Held(0, _NONE, 0, _NONE, 0)
        done, queued, running = split(elig, self.store.settled(step), held.running, held.queued)
        finished = winners.column("finished_at")
        rates = [_count(pc.greater_equal(finished, now - win)) / _span(finished, now, win) for win in WINDOWS_S]
        upper = len(reachable(self.protocol, step, self.items.items, self.store, self.frames_dir)) if open_before else 0
        remaining = max(upper, len(elig)) - done
        moving = rates[1] > 0 and remaining and workers  # no ETA while no worker, or none known (Redis away)
        bare = frameless(self.protocol, step, self.items.items, self.store, self.frames_dir)
        return StepStatus(
            step=step,
            eligible=len(elig),
            done=done,
            ok=_count(ok),
            removed=_count(pc.and_(ok, pc.fill_null(winners.column("removed"), False))),
            errors=winners.num_rows - _count(ok),
            no_frames=bare.total,
            no_frames_other=bare.other,
            remaining=remaining,
            queued_jobs=in_queue.queued_jobs if in_queue else None,
            queued_items=queued if in_queue else None,
            running_jobs=in_queue.running_jobs if in_queue else None,
            running_items=running if in_queue else None,
            failed_jobs=in_queue.failed_jobs if in_queue else None,
            items_per_s_1m=rates[0],
            items_per_s_5m=rates[1],
            items_per_s_working=working_rate(step_rows(step, self.store, self.items)),
            eta_s=remaining / rates[1] if moving else None,
            workers=workers,
            prefix_cache_hit_rate=cache.rate if cache else None,
        )

    def _items_in(self, screen: Screen, job_ids: list[str]) -> pa.Array:
        """The items of these jobs (a job id is a content hash: its items never change, so they are cached)."""
        missing = [j for j in job_ids if j not in self._job_items]
        for jid, chunk in screen.payloads(missing).items():
            self._job_items[jid] = pa.array(chunk.items, pa.string())
        parts = [self._job_items[j] for j in job_ids if j in self._job_items]
        return pa.concat_arrays(parts) if parts else _NONE


_NONE = pa.array([], pa.string())


def servers(workers: list[WorkerStatus]) -> list[ServerStatus]:
    """Each server once: the view of the worker that read it last (several workers may share a server), and
    the steps all its workers take."""
    out: dict[str, ServerStatus] = {}
    for w in sorted(workers, key=lambda w: w.updated_at):
        if w.engine is None:
            continue
        steps = sorted({*w.steps, *(out[w.server].steps if w.server in out else ())})
        out[w.server] = ServerStatus(server=w.server, steps=steps, engine=w.engine)
    return [out[k] for k in sorted(out)]


@dataclass(frozen=True)
class Held:
    """One step's jobs in Redis: counts of jobs, and the items of the waiting and the running ones."""

    queued_jobs: int
    queued: pa.Array
    running_jobs: int
    running: pa.Array
    failed_jobs: int


def split(elig: pa.Array, settled: pa.Array, running: pa.Array, queued: pa.Array) -> tuple[int, int, int]:
    """(done, queued, running) as disjoint counts of eligible items, so done + queued + running <= eligible:
    a job's items that already have rows (a re-run, a recovery) or are also in a running job (a rescued
    job running twice) count once, where they are furthest on."""
    is_done = pc.is_in(elig, value_set=settled)
    is_running = pc.and_(pc.invert(is_done), pc.is_in(elig, value_set=running))
    is_queued = pc.and_(pc.invert(pc.or_(is_done, is_running)), pc.is_in(elig, value_set=queued))
    return _count(is_done), _count(is_queued), _count(is_running)


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
