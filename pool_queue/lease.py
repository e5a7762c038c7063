"""Leases on RQ jobs for an asyncio worker that runs several jobs at once.

RQ's own workers run one job at a time; ours keeps the GPU busy across job boundaries, so it
takes jobs through RQ's data model directly: LMOVE to the intermediate list, an Execution in the
StartedJobRegistry whose score is the lease expiry, heartbeats that extend it, and on success the
FinishedJobRegistry. A worker that dies (SIGKILL, node lost) stops heartbeating; once its lease
expires, `rescue` (run by every worker and by pool-enqueue) puts the job back on its queue via
RQ's abandoned-job handling (the job's Retry budget).
"""

from __future__ import annotations

from dataclasses import dataclass

from redis import Redis
from rq import Queue
from rq.executions import Execution
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job, JobStatus
from rq.registry import FinishedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.utils import now

from .queue import RESULT_TTL_S

HEARTBEAT_S = 5.0
LEASE_S = 30  # a job whose worker stopped heartbeating returns to its queue this long after


@dataclass
class Lease:
    job: Job
    queue: Queue
    execution: Execution

    @property
    def step(self) -> int:
        return int(self.job.args[0])

    @property
    def item_ids(self) -> list[str]:
        return list(self.job.args[1])

    @property
    def redelivered(self) -> bool:
        """A job some worker took before (it may have written rows for part of it)."""
        return int(self.job.meta.get("taken", 1)) > 1


def claim(conn: Redis, queues: list[Queue], worker_name: str) -> Lease | None:
    """Take the first job of the first non-empty queue (queues in priority order), or None."""
    for q in queues:
        res = Queue.dequeue_any([q], None, connection=conn, serializer=JSONSerializer)
        if res is None:
            continue
        job, queue = res
        with conn.pipeline() as p:
            execution = Execution.create(job, LEASE_S, pipeline=p, worker_name=worker_name)
            job.prepare_for_execution(worker_name, pipeline=p)
            p.lrem(queue.intermediate_queue_key, 1, job.id)
            job.meta["taken"] = int(job.meta.get("taken", 0)) + 1
            p.hset(job.key, "meta", job.serializer.dumps(job.meta))
            p.execute()
        return Lease(job, queue, execution)
    return None


def heartbeat(conn: Redis, leases: list[Lease]) -> None:
    if not leases:
        return
    with conn.pipeline() as p:
        for lease in leases:
            lease.execution.heartbeat(lease.job.started_job_registry, LEASE_S, pipeline=p)
            p.hset(lease.job.key, "last_heartbeat", now().isoformat())
        p.execute()


def finish(conn: Redis, lease: Lease) -> None:
    """Acknowledge: call only after the job's rows are on disk."""
    job = lease.job
    with conn.pipeline() as p:
        lease.execution.delete(job, pipeline=p)
        job.ended_at = now()
        job.set_status(JobStatus.FINISHED, pipeline=p)
        p.hset(job.key, "ended_at", job.ended_at.isoformat())
        FinishedJobRegistry(queue=lease.queue).add(job, RESULT_TTL_S, pipeline=p)
        p.expire(job.key, RESULT_TTL_S)
        p.execute()


def release(conn: Redis, lease: Lease) -> None:
    """Give a job back untouched (worker stopping before it began, or server misconfigured)."""
    with conn.pipeline() as p:
        lease.execution.delete(lease.job, pipeline=p)
        lease.job.set_status(JobStatus.QUEUED, pipeline=p)
        p.rpush(lease.queue.key, lease.job.id)
        p.execute()


def rescue(conn: Redis, queues: list[Queue]) -> int:
    """Re-queue jobs whose lease expired or that were stuck between LMOVE and registration."""
    n = 0
    for q in queues:
        reg = StartedJobRegistry(queue=q)
        n += len(reg.get_expired_job_ids())
        reg.cleanup()  # abandoned jobs with retries left go back to the queue (RQ semantics)
        inter = IntermediateQueue(q.key, conn)
        for jid in inter.get_job_ids():
            if jid in reg:
                continue
            if inter.set_first_seen(jid) or not inter.should_be_cleaned_up(jid):
                continue
            with conn.pipeline() as p:
                p.lrem(inter.key, 1, jid)
                p.rpush(q.key, jid)
                p.execute()
            n += 1
    return n
