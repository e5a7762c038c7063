"""Work in Redis with RQ: one queue per step (`pool-step<N>`), jobs of item-id chunks.

Jobs use RQ's JSON serializer (nothing from Redis is ever unpickled) and deterministic ids (a
hash of step and chunk), so enqueueing the same chunk twice cannot create two jobs. Redis holds
only work: everything it holds can be rebuilt from the store (`pool-enqueue` reconciles).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from redis import Redis
from rq import Queue, Retry
from rq.job import Job
from rq.serializers import JSONSerializer

JOB_FUNC = "workers.tasks.screen_chunk"
ABANDON_RETRIES = 20  # times a job may be re-queued after its worker vanished
RESULT_TTL_S = 3600
BATCH = 500  # jobs per Redis pipeline
LIVE = {b"queued", b"started", b"scheduled", b"deferred"}


def queue_name(step: int) -> str:
    return f"pool-step{step}"


def step_queue(conn: Redis, step: int) -> Queue:
    return Queue(queue_name(step), connection=conn, serializer=JSONSerializer, default_timeout=-1)


def chunk_job_id(step: int, item_ids: Sequence[str]) -> str:
    return f"s{step}-" + hashlib.sha1("\n".join(item_ids).encode()).hexdigest()[:24]


def _job_data(step: int, ids: list[str], job_id: str) -> object:
    return Queue.prepare_data(
        JOB_FUNC,
        args=(step, ids),
        job_id=job_id,
        timeout=-1,
        result_ttl=RESULT_TTL_S,
        failure_ttl=7 * 86400,
        retry=Retry(max=ABANDON_RETRIES),
        description=f"step {step}: {len(ids)} items from {ids[0]}",
    )


def enqueue_chunks(conn: Redis, step: int, item_ids: Sequence[str], chunk_size: int) -> int:
    """Bulk-enqueue item ids as chunk jobs, in pipelines; returns the number of jobs created."""
    q = step_queue(conn, step)
    chunks = [list(item_ids[i : i + chunk_size]) for i in range(0, len(item_ids), chunk_size)]
    made = 0
    for b in range(0, len(chunks), BATCH):
        batch = chunks[b : b + BATCH]
        ids = [chunk_job_id(step, c) for c in batch]
        with conn.pipeline() as p:
            for jid in ids:
                p.hget(Job.key_for(jid), "status")
            status = p.execute()
        # a job still waiting or running is not made twice; a finished one may be (new results root)
        fresh = [_job_data(step, c, jid) for c, jid, st in zip(batch, ids, status, strict=True) if st not in LIVE]
        if fresh:
            with conn.pipeline() as p:
                q.enqueue_many(fresh, pipeline=p)  # type: ignore[arg-type]
                p.execute()
            made += len(fresh)
    return made


def enqueue_followup(conn: Redis, step: int, item_ids: list[str], parent_id: str) -> str | None:
    """Chain: the survivors of a finished job become one job of the next step (once per parent)."""
    if not item_ids:
        return None
    jid = f"s{step}-from-{parent_id}"
    if conn.exists(Job.key_for(jid)):
        return None
    with conn.pipeline() as p:
        step_queue(conn, step).enqueue_many([_job_data(step, item_ids, jid)], pipeline=p)  # type: ignore[list-item]
        p.execute()
    return jid


def pending_job_ids(conn: Redis, step: int) -> list[str]:
    """Jobs waiting, being moved to a worker, or running."""
    q = step_queue(conn, step)
    waiting = [j.decode() if isinstance(j, bytes) else j for j in conn.lrange(q.key, 0, -1)]
    moving = [j.decode() if isinstance(j, bytes) else j for j in conn.lrange(q.intermediate_queue_key, 0, -1)]
    running = q.started_job_registry.get_job_ids()
    return list(dict.fromkeys([*waiting, *moving, *running]))


def job_item_ids(conn: Redis, job_ids: Iterable[str]) -> list[str]:
    """Item ids inside the given jobs (jobs that vanished are skipped)."""
    ids = list(job_ids)
    out: list[str] = []
    for b in range(0, len(ids), BATCH):
        for job in Job.fetch_many(ids[b : b + BATCH], connection=conn, serializer=JSONSerializer):
            if job is not None:
                out.extend(job.args[1])
    return out


def busy(conn: Redis, steps: Iterable[int] = (1, 2, 3)) -> bool:
    """Any job waiting, being handed over, or running on these steps' queues."""
    for step in steps:
        q = step_queue(conn, step)
        if q.count or q.started_job_registry.count or conn.llen(q.intermediate_queue_key):
            return True
    return False
