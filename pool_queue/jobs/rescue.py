"""Jobs whose worker is gone, back on their queues: leases that expired, and ids left in RQ's intermediate list.

Leases are written and judged on Redis's clock (`TIME`), the one clock every host shares, so a node whose
clock is minutes off neither re-queues healthy jobs nor holds dead ones past their lease. RQ's own
readers (`rq info`) still judge on the clock of the host they run on.
"""

from __future__ import annotations

from redis import Redis
from rq import Queue
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job
from rq.registry import StartedJobRegistry


def redis_now(conn: Redis) -> float:
    sec, usec = conn.time()
    return float(sec) + usec / 1e6


def expire_leases(conn: Redis, queues: list[Queue]) -> int:
    """RQ's abandoned-job handling (with the job's Retry budget) for leases past their expiry on Redis's clock."""
    now = redis_now(conn)
    n = 0
    for q in queues:
        reg = StartedJobRegistry(queue=q)
        n += len(reg.get_expired_job_ids(timestamp=now))
        reg.cleanup(timestamp=now)
    return n


def rescue(conn: Redis, queues: list[Queue], seen: set[str] | None = None) -> int:
    """Expired leases, then jobs left in a queue's intermediate list by a worker (or a Redis) that died
    between RQ's move of the id and the start of the job.

    Such an id is put back at once when `seen` is None (a one-off recovery: `pool-enqueue`), else when it
    was already an orphan on the caller's previous pass (`seen` is updated). Putting back a job that a
    live worker is starting in that instant is harmless: the job leaves its queue only in state QUEUED,
    so the second copy of its id is passed over (`lease.claim`)."""
    n = expire_leases(conn, queues)
    now_orphans: set[str] = set()
    for q in queues:
        reg = StartedJobRegistry(queue=q)
        inter = IntermediateQueue(q.key, conn)
        for jid in inter.get_job_ids():
            if jid in reg:
                continue
            if seen is not None and jid not in seen:
                now_orphans.add(jid)  # put back on the next pass if still there
                continue
            with conn.pipeline() as pipe:
                pipe.lrem(inter.key, 1, jid)
                if conn.exists(Job.key_for(jid)):
                    pipe.rpush(q.key, jid)
                    n += 1
                pipe.execute()
    if seen is not None:
        seen.clear()
        seen.update(now_orphans)
    return n
