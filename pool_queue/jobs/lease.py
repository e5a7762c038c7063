"""A job's life in our worker, through RQ's public API: claim -> heartbeats -> finish | give back | fail.

RQ's released workers run one job at a time; ours runs several at once over asyncio, so it drives
RQ's lifecycle itself and writes only what RQ reads back, through RQ's own methods: an Execution
per job in the StartedJobRegistry (its score is the lease's expiry), `Execution.heartbeat` and
`Job.heartbeat` to extend it, RQ's registries and results at the end. A worker that dies stops
heartbeating; once its lease expires, RQ's `StartedJobRegistry.cleanup` (run on Redis's clock by every
worker's rescue loop, `pool-enqueue` and `pool-status`: `rescue.py`) puts the job back on its queue.

Every end of a job is one transaction that first checks the job is still ours (status STARTED and
our execution registered). A job that was rescued, re-created or flushed meanwhile is left alone,
so no job is ever both acknowledged and re-queued; its rows are on disk either way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from pydantic import ValidationError
from redis import Redis, RedisError
from redis.client import Pipeline
from rq import Queue, Worker
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.registry import FinishedJobRegistry
from rq.results import Result
from rq.serializers import JSONSerializer
from rq.utils import now, utcformat
from rq.worker import BaseWorker, WorkerStatus

from .queue import RESULT_TTL_S, ChunkJob, Screen
from .rescue import redis_now

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Timing:
    """How fast a dead worker's jobs come back: within `lease_s` + `rescue_s` of its last heartbeat."""

    lease_s: int = 30
    heartbeat_s: float = 5.0
    rescue_s: float = 15.0
    max_failures: int = 3  # a job whose run raised this many times goes to RQ's failed registry


@dataclass
class Lease:
    job: Job
    queue: Queue
    execution: Execution
    payload: ChunkJob

    @property
    def check_store(self) -> bool:
        """Some of its items may have rows already: a worker took it before, or it was enqueued while its
        step had rows (a recovery beside running workers). Its items are checked against the store first."""
        return int(self.job.meta.get("taken", 1)) > 1 or bool(self.job.meta.get("recheck"))

    @property
    def failures(self) -> int:
        return int(self.job.meta.get("failures", 0))


def claim(screen: Screen, queues: list[Queue], worker_name: str, lease_s: int) -> Lease | None:
    """Take the first job of the first non-empty queue (queues in priority order), or None.

    A job in a state we did not expect (finished, failed, running elsewhere, not ours) is logged
    and passed over, never run."""
    for q in queues:
        while True:
            try:
                res = Queue.dequeue_any([q], None, connection=screen.conn, serializer=JSONSerializer)
            except RedisError:
                raise
            except Exception as e:  # a job hash RQ itself cannot read: drop the id, the store re-plans it
                jid = getattr(e, "job_id", None)
                log.error("job %s on %s is unreadable (%s): dropped; pool-enqueue re-creates its work", jid, q.name, e)
                if jid:
                    screen.conn.lrem(q.intermediate_queue_key, 1, jid)
                continue
            if res is None:
                break
            lease = _start(screen, res[0], res[1], worker_name, lease_s)
            if lease is not None:
                return lease
    return None


def _start(screen: Screen, job: Job, queue: Queue, worker_name: str, lease_s: int) -> Lease | None:
    try:
        payload = ChunkJob.model_validate(job.kwargs)
    except ValidationError:
        payload = None
    if payload is None or payload.screen != screen.id:
        log.error("job %s on %s is not a chunk of screen %s: passed over", job.id, queue.name, screen.id)
        screen.conn.lrem(queue.intermediate_queue_key, 1, job.id)
        return None
    job.meta["taken"] = int(job.meta.get("taken", 0)) + 1

    def txn(pipe: Pipeline) -> Execution | None:
        status = _text(pipe.hget(job.key, "status"))
        expiry = redis_now(pipe) + lease_s
        pipe.multi()
        pipe.lrem(queue.intermediate_queue_key, 1, job.id)
        if status != JobStatus.QUEUED:
            return None
        execution = Execution.create(job, lease_s, pipeline=pipe, worker_name=worker_name)
        pipe.zadd(job.started_job_registry.key, {execution.composite_key: expiry}, xx=True)  # on Redis's clock
        job.prepare_for_execution(worker_name, pipeline=pipe)
        pipe.hset(job.key, "meta", job.serializer.dumps(job.meta))  # RQ's own encoding of its meta field
        return execution

    execution = _transact(screen.conn, txn, job.key)
    if execution is None:
        log.warning("job %s came off %s in state %s: passed over", job.id, queue.name, job.get_status(refresh=True))
        return None
    return Lease(job, queue, execution, payload)


def heartbeat(conn: Redis, leases: list[Lease], lease_s: int) -> None:
    """Renew the leases of jobs that still exist: a heartbeat never re-creates a job hash that was
    deleted or flushed meanwhile (RQ could not read the stub it would leave)."""
    if not leases:
        return

    def txn(pipe: Pipeline) -> None:
        there = [bool(pipe.exists(lease.job.key)) for lease in leases]
        expiry = redis_now(pipe) + lease_s
        pipe.multi()
        for lease, ok in zip(leases, there, strict=True):
            if ok:
                reg = lease.job.started_job_registry
                lease.execution.heartbeat(reg, lease_s, pipeline=pipe)
                pipe.zadd(reg.key, {lease.execution.composite_key: expiry}, xx=True)  # on Redis's clock (rescue.py)
                lease.job.heartbeat(now(), lease_s, pipeline=pipe)

    _transact(conn, txn, *(lease.job.key for lease in leases))


def _transact(conn: Redis, fn: Callable[[Pipeline], T], *watch: str) -> T:
    """`fn` reads the watched keys, calls `multi()`, queues writes; re-run if a watched key changed."""
    return cast(T, conn.transaction(fn, *watch, value_from_callable=True))  # type: ignore[arg-type]


def _is_ours(pipe: Pipeline, lease: Lease) -> bool:
    """Inside a watched transaction: the job is STARTED and our execution is still registered."""
    status = _text(pipe.hget(lease.job.key, "status"))
    member = pipe.zscore(lease.job.started_job_registry.key, lease.execution.composite_key)
    return status == JobStatus.STARTED and member is not None


def _owned(conn: Redis, lease: Lease, then: Callable[[Pipeline], object]) -> bool:
    """Run `then` in a transaction if the job is still ours; False (nothing written) if not."""

    def txn(pipe: Pipeline) -> bool:
        ours = _is_ours(pipe, lease)
        pipe.multi()  # with nothing queued the transaction still checks the watched keys
        if ours:
            lease.execution.delete(lease.job, pipeline=pipe)
            then(pipe)
        return ours

    ours = _transact(conn, txn, lease.job.key, lease.job.started_job_registry.key)
    if not ours:
        _not_ours(lease)
    return ours


def _working_time(worker: BaseWorker, job: Job, pipe: Pipeline) -> None:
    if job.started_at is not None:
        worker.increment_total_working_time(now() - job.started_at, pipeline=pipe)


def _not_ours(lease: Lease) -> None:
    log.warning("job %s is no longer ours (rescued, re-created or flushed meanwhile): left as it is", lease.job.id)


def finish(
    screen: Screen, lease: Lease, follow: list[str], next_step: int | None, worker: BaseWorker | None = None
) -> bool:
    """Acknowledge, and queue the survivors for `next_step`, in one transaction: call only after the
    job's rows are on disk. The follow-up is queued even when the job is no longer ours (its rows are
    on disk), once per parent; the acknowledgement only when it is. False when it was not ours.
    `worker`'s own counts (`rq info`, rq-dashboard) move in the same transaction."""
    job, registry = lease.job, lease.job.started_job_registry
    fid = screen.followup_id(next_step, job.id) if next_step is not None and follow else None
    watch = [job.key, registry.key, *([Job.key_for(fid)] if fid else [])]

    def txn(pipe: Pipeline) -> bool:
        ours = _is_ours(pipe, lease)
        chain = fid is not None and not pipe.exists(Job.key_for(fid))
        pipe.multi()
        if chain:
            screen.add_followup(pipe, next_step, follow, job.id)  # type: ignore[arg-type]
        if ours:
            lease.execution.delete(job, pipeline=pipe)
            job.ended_at = now()
            job.set_status(JobStatus.FINISHED, pipeline=pipe)
            pipe.hset(job.key, "ended_at", utcformat(job.ended_at))
            FinishedJobRegistry(queue=lease.queue).add(job, RESULT_TTL_S, pipeline=pipe)
            pipe.expire(job.key, RESULT_TTL_S)
            if worker is not None:
                worker.increment_successful_job_count(pipeline=pipe)
                _working_time(worker, job, pipe)
        return ours

    ours = _transact(screen.conn, txn, *watch)
    if not ours:
        _not_ours(lease)
    return ours


def give_back(conn: Redis, lease: Lease, untouched: bool = True) -> bool:
    """Return a job to the front of its queue (worker stopping, server misconfigured, silent or unwritable
    disk). A job that may have left rows (`untouched` False) keeps its count of takes, so its next run
    checks the store first."""
    if untouched:
        lease.job.meta["taken"] = max(0, int(lease.job.meta.get("taken", 1)) - 1)
    return _owned(conn, lease, lambda pipe: lease.queue.enqueue_job(lease.job, pipeline=pipe, at_front=True))


def fail(
    conn: Redis, lease: Lease, reason: str, worker_name: str, max_failures: int, worker: BaseWorker | None = None
) -> bool:
    """A run of the job raised: back on its queue, or after `max_failures` into RQ's failed registry
    with the reason (`rq info` counts it; `pool-status` shows it). True when it is failed for good."""
    job = lease.job
    job.meta["failures"] = lease.failures + 1
    final = job.meta["failures"] >= max_failures

    def then(pipe: Pipeline) -> None:
        pipe.hset(job.key, "meta", job.serializer.dumps(job.meta))
        if worker is not None:
            worker.increment_failed_job_count(pipeline=pipe)
            _working_time(worker, job, pipe)
        if final:
            job.ended_at = now()
            job.set_status(JobStatus.FAILED, pipeline=pipe)
            job.failed_job_registry.add(job, ttl=job.failure_ttl, exc_string=reason, pipeline=pipe)
            Result.create_failure(job, job.failure_ttl, reason, worker_name=worker_name, pipeline=pipe)
        else:
            lease.queue.enqueue_job(job, pipeline=pipe)

    return _owned(conn, lease, then) and final


class ShownWorker(Worker):
    """RQ's record of a pool worker, its state in it from its birth: RQ's own work loop writes a state just
    after `register_birth`, which writes none, and ours writes one only as its jobs change (`show_state`), so
    `rq info` showed the state "?" until the first job, and again after a heartbeat registered it anew."""

    def serialize(self) -> dict[str, Any]:
        return {**super().serialize(), "state": self.get_state()}


def show_state(worker: BaseWorker, jobs: list[str]) -> None:
    """RQ's view of a worker (`rq info`, rq-dashboard), through its public API: busy while it holds any of `jobs`,
    idle when it holds none. RQ 3 finds the current jobs in the worker's executions, which `claim` registers;
    RQ 2 keeps one current job in the worker's hash: the first of `jobs`. A worker whose key is gone (Redis
    flushed) is left to its next heartbeat, which registers it whole: a write here would leave a stub RQ lists
    nowhere and the heartbeat would take for the worker."""

    def txn(pipe: Pipeline) -> None:
        there = pipe.exists(worker.key)
        pipe.multi()
        if there:
            worker.set_state(WorkerStatus.BUSY if jobs else WorkerStatus.IDLE, pipeline=pipe)
            if hasattr(worker, "set_current_job_id"):  # RQ 2 only
                worker.set_current_job_id(jobs[0] if jobs else None, pipeline=pipe)

    _transact(worker.connection, txn, worker.key)


def _text(v: bytes | str | None) -> str | None:
    return v.decode() if isinstance(v, bytes) else v
