"""The work queue (pool_queue.jobs.queue) against a real redis-server: chunk jobs, their ids and payloads,
the one snapshot every reader shares, and cleanup of failed jobs."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

from rq.executions import Execution, ExecutionRegistry
from rq.job import Job
from rq.serializers import JSONSerializer
from stack import make_screen

from pool_queue.jobs import lease
from pool_queue.jobs.queue import ChunkJob, Screen, cuts, other_screens

IDS = [f"item-{i:03d}" for i in range(10)]


def test_chunks_are_named_by_their_items_and_never_made_twice(screen: Screen) -> None:
    assert screen.enqueue_chunks(1, IDS, 4) == 3  # 4 + 4 + 2
    q = screen.snapshot([1])[1]
    want = [screen.job_id(1, IDS[a:b]) for a, b in ((0, 4), (4, 8), (8, 10))]
    assert q.waiting == want and q.running == [] and q.failed == {}
    assert screen.enqueue_chunks(1, IDS, 4) == 0  # the same items again: the same ids, still waiting
    assert screen.snapshot([1])[1].waiting == want
    assert screen.payloads(want) == {
        j: ChunkJob(screen=screen.id, step=1, items=IDS[a:b])
        for j, (a, b) in zip(want, ((0, 4), (4, 8), (8, 10)), strict=True)
    }
    assert screen.job_id(1, IDS[:4]) != screen.job_id(2, IDS[:4]) != screen.job_id(1, IDS[1:5])


def test_a_job_is_plain_json_that_rq_reads(screen: Screen) -> None:
    screen.enqueue_chunks(2, IDS[:3], 64)
    (jid,) = screen.snapshot([2])[2].waiting
    raw = screen.conn.hget(Job.key_for(jid), "data")
    assert raw is not None
    json.loads(zlib.decompress(raw))  # RQ compresses the payload: under it is JSON, never a pickle
    job = Job.fetch(jid, connection=screen.conn, serializer=JSONSerializer)
    assert job.kwargs == {"screen": screen.id, "step": 2, "items": IDS[:3]}
    assert job.origin == screen.queue_name(2) and job.description == "step 2: 3 items from item-000"


def test_videos_keep_a_chunk_whole_up_to_twice_its_size(screen: Screen) -> None:
    videos = ["a", "a", "a", "b", "b", "c", "c", "c", "c", "c"]
    assert cuts(10, 2, videos) == [(0, 3), (3, 5), (5, 9), (9, 10)]  # c has 5 items: cut at 2 x 2
    screen.enqueue_chunks(3, IDS, 2, videos=videos)
    chunks = [p.items for p in screen.payloads(screen.snapshot([3])[3].waiting).values()]
    assert chunks == [IDS[0:3], IDS[3:5], IDS[5:9], IDS[9:10]]


def test_a_finished_chunk_may_be_made_again(screen: Screen) -> None:
    screen.enqueue_chunks(1, IDS[:4], 4)
    held = lease.claim(screen, [screen.queue(1)], "w", 30)
    assert held is not None and screen.busy([1]) and not screen.busy([2])
    assert screen.enqueue_chunks(1, IDS[:4], 4) == 0  # running: not made twice
    assert lease.finish(screen, held, IDS[:2], 2)
    assert screen.snapshot([2])[2].waiting == [screen.followup_id(2, held.job.id)]
    assert screen.payloads([screen.followup_id(2, held.job.id)])[screen.followup_id(2, held.job.id)].items == IDS[:2]
    assert not screen.busy([1])
    assert screen.enqueue_chunks(1, IDS[:4], 4) == 1  # finished: a later run may make it again (recovery)


def test_failed_jobs_are_listed_with_their_reason_then_forgotten(screen: Screen) -> None:
    screen.enqueue_chunks(1, IDS[:4], 4)
    held = lease.claim(screen, [screen.queue(1)], "w", 30)
    assert held is not None
    assert lease.fail(screen.conn, held, "RuntimeError: the server refused", "w", max_failures=1)
    q = screen.snapshot([1])[1]
    assert q.pending == [] and list(q.failed) == [held.job.id]
    assert "the server refused" in q.failed[held.job.id]
    assert screen.forget_failed(1) == 1 and screen.snapshot([1])[1].failed == {}
    assert screen.enqueue_chunks(1, IDS[:4], 4) == 1


def test_a_failed_job_whose_execution_expired_moments_ago_is_forgotten(screen: Screen) -> None:
    """RQ keeps an execution's registry entry a minute past its hash's TTL; deleting the job in that
    minute must not fail on the entry whose hash is gone."""
    screen.enqueue_chunks(1, IDS[:4], 4)
    held = lease.claim(screen, [screen.queue(1)], "w", 30)
    assert held is not None
    assert lease.fail(screen.conn, held, "RuntimeError: the server refused", "w", max_failures=1)
    executions = ExecutionRegistry(job_id=held.job.id, connection=screen.conn)
    with screen.conn.pipeline() as p:  # an entry whose hash has expired: listed, but not in Redis
        executions.add(Execution("expired", held.job.id, screen.conn), ttl=30, pipeline=p)
        p.execute()
    assert "expired" in executions.get_execution_ids()
    assert screen.forget_failed(1) == 1 and screen.snapshot([1])[1].failed == {}
    assert not screen.conn.exists(held.job.key) and executions.get_execution_ids() == []
    assert screen.enqueue_chunks(1, IDS[:4], 4) == 1


def test_screens_on_one_redis_see_each_other_and_not_each_others_jobs(tmp_path: Path, redis_url: str) -> None:
    a = make_screen(tmp_path / "a", redis_url)
    b = make_screen(tmp_path / "b", redis_url)
    a.enqueue_chunks(1, IDS, 5)
    b.enqueue_chunks(1, IDS, 5)
    assert other_screens(a.conn, a.id) == [b.id] and other_screens(b.conn, b.id) == [a.id]
    assert set(a.snapshot([1])[1].waiting).isdisjoint(b.snapshot([1])[1].waiting)
    assert b.payloads(a.snapshot([1])[1].waiting) == {}  # another screen's payloads are not ours
