"""The queue contract: where a screen's work lives in Redis, what a job holds, and one view of it.

A screen is one results root under one protocol. Its id prefixes every queue and job id, so two
screens share a Redis without ever taking each other's work. Per step one RQ queue
(`pool-<screen>-step<N>`); per chunk of item ids one job whose payload is a `ChunkJob` (RQ's JSON
serializer: nothing from Redis is unpickled). Job ids are content hashes, so enqueueing the same
chunk twice cannot make two jobs. Redis holds only work: all of it can be rebuilt from the store.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel
from redis import Redis
from rq import Queue, Retry
from rq.exceptions import NoSuchJobError
from rq.executions import Execution, ExecutionRegistry
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

from ..store.store import Store
from .rescue import expire_leases

JOB_FUNC = "workers.tasks.screen_chunk"
ABANDON_RETRIES = 20  # times a job may return after its worker vanished (RQ's Retry budget)
RESULT_TTL_S = 3600
FAILURE_TTL_S = 7 * 86400
BATCH = 500  # jobs per Redis pipeline
PREFIX = "pool-"
LIVE = {JobStatus.QUEUED, JobStatus.STARTED, JobStatus.SCHEDULED, JobStatus.DEFERRED}


def screen_of(store: Store, conn: Redis) -> Screen | None:
    """The screen of a results root: from the root's own token (not its path, which differs between a
    container and its host) and the protocol's fingerprint. None while the root is not stamped."""
    token = store.screen_token()
    if token is None:
        return None
    return Screen(hashlib.sha1(f"{token}:{store.fingerprint}".encode()).hexdigest()[:10], conn)


class ChunkJob(BaseModel):
    """A job's payload (RQ kwargs)."""

    screen: str
    step: int
    items: list[str]


@dataclass(frozen=True)
class StepQueue:
    """One step's jobs by state (job ids); `failed` maps a job to its last error."""

    step: int
    waiting: list[str]
    moving: list[str]  # taken from the queue, not yet registered as running
    running: list[str]
    failed: dict[str, str]

    @property
    def pending(self) -> list[str]:
        return list(dict.fromkeys([*self.waiting, *self.moving, *self.running]))


@dataclass(frozen=True)
class Screen:
    id: str
    conn: Redis

    def queue_name(self, step: int) -> str:
        return f"{PREFIX}{self.id}-step{step}"

    def queue(self, step: int) -> Queue:
        return Queue(self.queue_name(step), connection=self.conn, serializer=JSONSerializer, default_timeout=-1)

    def job_id(self, step: int, item_ids: Sequence[str]) -> str:
        return f"{self.id}-s{step}-" + hashlib.sha1("\n".join(item_ids).encode()).hexdigest()[:24]

    def followup_id(self, step: int, parent_id: str) -> str:
        return f"{self.id}-s{step}-from-{hashlib.sha1(parent_id.encode()).hexdigest()[:24]}"

    def _job_data(self, step: int, ids: list[str], job_id: str, recheck: bool = False) -> object:
        return Queue.prepare_data(
            JOB_FUNC,
            kwargs=ChunkJob(screen=self.id, step=step, items=ids).model_dump(),
            job_id=job_id,
            timeout=-1,
            result_ttl=RESULT_TTL_S,
            failure_ttl=FAILURE_TTL_S,
            retry=Retry(max=ABANDON_RETRIES, enqueue_at_front=True),  # a rescued job runs next, not last
            description=f"step {step}: {len(ids)} items from {ids[0]}",
            meta={"recheck": True} if recheck else None,
        )

    def enqueue_chunks(
        self,
        step: int,
        item_ids: Sequence[str],
        chunk_size: int,
        recheck: bool = False,
        videos: Sequence[str] | None = None,
    ) -> int:
        """Bulk-enqueue item ids as chunk jobs, in pipelines; returns the number of jobs created. `recheck`:
        workers may still be writing rows for these items (a recovery), so they check the store first.
        `videos` (one per id, ids sorted by video): a chunk never splits a video."""
        q = self.queue(step)
        chunks = [list(item_ids[a:b]) for a, b in cuts(len(item_ids), chunk_size, videos)]
        made = 0
        for b in range(0, len(chunks), BATCH):
            batch = chunks[b : b + BATCH]
            ids = [self.job_id(step, c) for c in batch]
            with self.conn.pipeline() as pipe:
                for jid in ids:
                    pipe.hget(Job.key_for(jid), "status")
                status = [s.decode() if isinstance(s, bytes) else s for s in pipe.execute()]
            # a job still waiting or running is not made twice; a finished or failed one may be
            todo = [(c, j) for c, j, st in zip(batch, ids, status, strict=True) if st not in LIVE]
            fresh = [self._job_data(step, c, j, recheck) for c, j in todo]
            if fresh:
                with self.conn.pipeline() as pipe:
                    q.enqueue_many(fresh, pipeline=pipe)  # type: ignore[arg-type]
                    pipe.execute()
                made += len(fresh)
        return made

    def add_followup(self, pipe: object, step: int, item_ids: list[str], parent_id: str) -> None:
        """Queue the survivors of `parent_id` as one job of `step` on `pipe` (a transaction the caller
        runs, so the parent's acknowledgement and its follow-up land together or not at all)."""
        data = self._job_data(step, item_ids, self.followup_id(step, parent_id))
        self.queue(step).enqueue_many([data], pipeline=pipe)  # type: ignore[list-item,arg-type]

    def snapshot(self, steps: Iterable[int]) -> dict[int, StepQueue]:
        """Every job of these steps by state: the one view that status, planning and the launcher read.

        Expired leases go back to their queue first (on Redis's clock), so jobs of dead workers show as
        waiting."""
        out = {}
        steps = list(steps)
        expire_leases(self.conn, [self.queue(s) for s in steps])
        for step in steps:
            q = self.queue(step)
            running = q.started_job_registry.get_job_ids(cleanup=False)
            waiting = [_text(j) for j in self.conn.lrange(q.key, 0, -1)]
            moving = [_text(j) for j in self.conn.lrange(q.intermediate_queue_key, 0, -1)]
            failed_ids = FailedJobRegistry(queue=q).get_job_ids()
            out[step] = StepQueue(step, waiting, moving, running, self._reasons(failed_ids))
        return out

    def _reasons(self, job_ids: list[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for b in range(0, len(job_ids), BATCH):
            part = job_ids[b : b + BATCH]
            for jid, job in zip(part, self.fetch_many(part), strict=True):
                res = job.latest_result() if job is not None else None
                out[jid] = (res.exc_string or "") if res is not None else "(reason expired)"
        return out

    def fetch_many(self, job_ids: list[str]) -> list[Job | None]:
        return Job.fetch_many(job_ids, connection=self.conn, serializer=JSONSerializer)

    def payloads(self, job_ids: Iterable[str]) -> dict[str, ChunkJob]:
        """Payloads of the given jobs (jobs that vanished or are not ours are left out)."""
        ids = list(job_ids)
        out: dict[str, ChunkJob] = {}
        for b in range(0, len(ids), BATCH):
            part = ids[b : b + BATCH]
            for jid, job in zip(part, self.fetch_many(part), strict=True):
                if job is not None and isinstance(job.kwargs, dict) and job.kwargs.get("screen") == self.id:
                    out[jid] = ChunkJob.model_validate(job.kwargs)
        return out

    def forget_failed(self, step: int) -> int:
        """Delete this step's failed jobs, so that the next plan counts their items as remaining."""
        reg = FailedJobRegistry(queue=self.queue(step))
        ids = reg.get_job_ids()
        for jid in ids:
            _drop_stale_executions(self.conn, jid)
            try:
                reg.remove(jid, delete_job=True)
            except NoSuchJobError:
                reg.remove(jid)
        return len(ids)

    def busy(self, steps: Iterable[int]) -> bool:
        """Any job of these steps waiting, being handed over, or running (counts only: polled often;
        expired leases go back first, as in `snapshot`)."""
        steps = list(steps)
        expire_leases(self.conn, [self.queue(s) for s in steps])
        for step in steps:
            q = self.queue(step)
            running = q.started_job_registry.get_job_count(cleanup=False)
            if running or q.count or self.conn.llen(q.intermediate_queue_key):
                return True
        return False


def _drop_stale_executions(conn: Redis, job_id: str) -> None:
    """Forget the executions of a job whose hashes Redis has already expired. A job's execution registry
    keeps each entry a minute past its hash's TTL, and RQ's `Job.delete` fetches every entry it lists,
    raising ValueError for one whose hash is gone: deleting a job that ran moments ago fails in that window."""
    executions = ExecutionRegistry(job_id=job_id, connection=conn)
    stale = [e for e in executions.get_execution_ids() if not conn.exists(Execution(e, job_id, conn).key)]
    if stale:
        with conn.pipeline() as pipe:
            for e in stale:
                executions.remove(Execution(e, job_id, conn), pipeline=pipe)
            pipe.execute()


def cuts(n: int, size: int, videos: Sequence[str] | None = None) -> list[tuple[int, int]]:
    """[start, end) of chunks of about `size`; with `videos`, each cut moves past the end of its video, so a
    video's items are sent together and vLLM's prefix cache reuses their frames. A video with very many
    items is still cut, at twice `size`: a job stays a job's size."""
    out, start = [], 0
    while start < n:
        end, most = min(n, start + size), min(n, start + 2 * size)
        while videos is not None and end < most and videos[end] == videos[end - 1]:
            end += 1
        out.append((start, end))
        start = end
    return out


def other_screens(conn: Redis, mine: str) -> list[str]:
    """Ids of the other screens with queues in this Redis."""
    names = {q.name for q in Queue.all(connection=conn, serializer=JSONSerializer)}
    ids = {n[len(PREFIX) :].rsplit("-step", 1)[0] for n in names if n.startswith(PREFIX) and "-step" in n}
    return sorted(ids - {mine})


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v
