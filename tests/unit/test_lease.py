"""The job lifecycle (pool_queue.jobs.lease) against a real redis-server, one transition at a time."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from rq import Worker
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, FinishedJobRegistry
from rq.serializers import JSONSerializer
from stack import make_screen

from pool_queue.jobs import lease
from pool_queue.jobs.queue import Screen, other_screens
from pool_queue.jobs.rescue import redis_now, rescue
from pool_queue.protocol import Protocol

P = Protocol()
IDS = [f"item-{i:03d}" for i in range(10)]


def take(screen: Screen, step: int = 1, lease_s: int = 30, name: str = "w") -> lease.Lease:
    got = lease.claim(screen, [screen.queue(step)], name, lease_s)
    assert got is not None
    return got


def rq_info(url: str, *flags: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "rq.cli", "info", "--url", url, "--serializer", "rq.serializers.JSONSerializer", *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_every_field_written_is_readable_by_rq_and_rq_info(screen: Screen, redis_url: str) -> None:
    screen.enqueue_chunks(1, IDS, 5)
    w = Worker([screen.queue(1)], name="w.host.abc123", connection=screen.conn, serializer=JSONSerializer)
    w.register_birth()
    held = take(screen, name=w.name)
    lease.heartbeat(screen.conn, [held], 30)
    w.heartbeat()
    job = Job.fetch(held.job.id, connection=screen.conn, serializer=JSONSerializer)  # parses every timestamp
    assert job.get_status() == JobStatus.STARTED and job.last_heartbeat is not None
    assert [x.name for x in Worker.all(connection=screen.conn)] == [w.name]
    assert "1 executing, 0 finished, 0 failed" in rq_info(redis_url)
    assert lease.finish(screen, held, ["item-000"], 2)
    job = Job.fetch(held.job.id, connection=screen.conn, serializer=JSONSerializer)
    assert job.get_status() == JobStatus.FINISHED and job.ended_at is not None
    assert held.job.id in FinishedJobRegistry(queue=screen.queue(1)).get_job_ids()
    follow = screen.payloads([screen.followup_id(2, held.job.id)])
    assert [c.items for c in follow.values()] == [["item-000"]]
    assert "0 executing, 1 finished, 0 failed" in rq_info(redis_url)


def test_a_pool_workers_record_has_a_state_from_its_birth_and_after_a_new_registration(screen: Screen) -> None:
    """RQ's own `register_birth` writes no state (RQ's work loop writes one just after): a reader such as
    `rq info` in between saw "?". A pool worker's record has its state from the first write on."""
    plain = Worker([screen.queue(1)], name="plain.host.abc123", connection=screen.conn, serializer=JSONSerializer)
    plain.register_birth()
    w = lease.ShownWorker([screen.queue(1)], name="w.host.abc123", connection=screen.conn, serializer=JSONSerializer)
    w.register_birth()
    states = {x.name: x.get_state() for x in Worker.all(connection=screen.conn)}
    assert states == {plain.name: "?", w.name: "starting"}  # the first: what RQ alone leaves
    lease.show_state(w, ["job-1"])
    screen.conn.delete(w.key)  # Redis lost the record: the next heartbeat registers the worker anew
    w.register_birth()
    assert Worker.find_by_key(w.key, connection=screen.conn).get_state() == "busy"  # type: ignore[union-attr]


def test_the_workers_own_counts_move_with_each_end_of_a_job(screen: Screen, redis_url: str) -> None:
    """`rq info` and rq-dashboard read RQ's per-worker counts: a finish counts once, a failed run once, a
    late acknowledgement (the job was not ours any more) not at all."""
    screen.enqueue_chunks(1, IDS, 5)
    w = Worker([screen.queue(1)], name="w.host.c0ffee", connection=screen.conn, serializer=JSONSerializer)
    w.register_birth()
    first, second = take(screen, name=w.name), take(screen, name=w.name)
    assert lease.finish(screen, first, [], 2, w)
    assert not lease.fail(screen.conn, second, "KeyError: x", w.name, max_failures=3, worker=w)  # re-queued
    again = take(screen, name=w.name)
    assert again.job.id == second.job.id
    assert not lease.finish(screen, second, [], 2, w)  # the first run's late ack: not ours, not counted
    w.refresh()
    assert (w.successful_job_count, w.failed_job_count) == (1, 1) and w.total_working_time >= 0
    assert "jobs: 1 finished, 1 failed" in rq_info(redis_url, "-W")


def test_a_finished_job_back_on_its_queue_is_passed_over(screen: Screen) -> None:
    screen.enqueue_chunks(1, IDS[:5], 5)
    held = take(screen)
    assert lease.finish(screen, held, [], 2)
    screen.conn.rpush(screen.queue(1).key, held.job.id)  # the race of a re-created id
    assert lease.claim(screen, [screen.queue(1)], "w2", 30) is None
    q = screen.snapshot([1])[1]
    assert q.pending == [] and held.job.get_status(refresh=True) == JobStatus.FINISHED


@pytest.mark.slow
def test_a_rescued_job_is_never_also_acknowledged(screen: Screen) -> None:
    screen.enqueue_chunks(1, IDS[:5], 5)
    held = take(screen, lease_s=1)
    time.sleep(1.5)  # no heartbeat: the lease expires
    assert rescue(screen.conn, [screen.queue(1)]) == 1
    assert screen.snapshot([1])[1].waiting == [held.job.id]
    assert not lease.finish(screen, held, ["item-001"], 2)  # the late ack of the first run writes nothing...
    assert held.job.get_status(refresh=True) == JobStatus.QUEUED
    assert screen.snapshot([2])[2].waiting == [screen.followup_id(2, held.job.id)]  # ...but chains its rows
    again = take(screen)
    assert again.check_store and again.job.id == held.job.id
    assert lease.finish(screen, again, ["item-001"], 2)
    assert len(screen.snapshot([2])[2].waiting) == 1  # the follow-up exists once


@pytest.mark.slow
def test_heartbeats_keep_a_job_past_its_lease(screen: Screen) -> None:
    screen.enqueue_chunks(1, IDS[:5], 5)
    held = take(screen, lease_s=2)
    for _ in range(8):  # 4 s, twice the lease
        time.sleep(0.5)
        lease.heartbeat(screen.conn, [held], 2)
        assert rescue(screen.conn, [screen.queue(1)]) == 0
    assert screen.snapshot([1])[1].running == [held.job.id]
    assert lease.finish(screen, held, [], 2)


def test_an_ack_after_redis_lost_everything_recreates_nothing(screen: Screen) -> None:
    screen.enqueue_chunks(1, IDS[:5], 5)
    held = take(screen)
    screen.conn.flushall()
    assert not lease.finish(screen, held, ["item-002"], 2)
    assert not screen.conn.exists(held.job.key)
    assert screen.snapshot([2])[2].waiting == [screen.followup_id(2, held.job.id)]


def test_raising_runs_go_back_then_end_in_the_failed_registry(screen: Screen, redis_url: str) -> None:
    screen.enqueue_chunks(1, IDS[:5], 5)
    for run in range(1, 4):
        held = take(screen)
        final = lease.fail(screen.conn, held, f"KeyError: run {run}", "w", max_failures=3)
        assert final == (run == 3)
        assert held.failures == run
    q = screen.snapshot([1])[1]
    assert q.pending == [] and q.failed == {held.job.id: "KeyError: run 3"}
    assert FailedJobRegistry(queue=screen.queue(1)).count == 1
    assert "0 executing, 0 finished, 1 failed" in rq_info(redis_url)
    assert screen.forget_failed(1) == 1 and screen.snapshot([1])[1].failed == {}


def test_a_job_given_back_is_next_and_untouched(screen: Screen) -> None:
    screen.enqueue_chunks(1, IDS, 5)
    held = take(screen)
    assert lease.give_back(screen.conn, held)
    assert screen.snapshot([1])[1].waiting[0] == held.job.id
    again = take(screen)
    assert again.job.id == held.job.id and not again.check_store


def test_two_screens_share_a_redis_without_sharing_work(tmp_path: Path, redis_url: str) -> None:
    a = make_screen(tmp_path / "a", redis_url)
    b = make_screen(tmp_path / "b", redis_url)
    assert a.id != b.id and a.job_id(1, IDS) != b.job_id(1, IDS)
    a.enqueue_chunks(1, IDS, 5)
    b.enqueue_chunks(1, IDS, 5)
    assert lease.claim(b, [b.queue(1)], "wb", 30) is not None
    assert {held.payload.screen for held in [take(a), take(a)]} == {a.id}
    assert other_screens(a.conn, a.id) == [b.id]
    a.conn.rpush(a.queue(1).key, b.job_id(1, IDS[5:]))  # a job of b's in a's queue: never run by a
    while (held := lease.claim(a, [a.queue(1)], "wa", 30)) is not None:
        assert held.payload.screen == a.id


def test_one_root_is_one_screen_wherever_it_is_mounted(tmp_path: Path, redis_url: str) -> None:
    a = make_screen(tmp_path / "results", redis_url)
    (tmp_path / "mnt").symlink_to(tmp_path / "results")  # the same root under another path
    assert make_screen(tmp_path / "mnt", redis_url).id == a.id


def test_an_id_left_in_the_intermediate_list_is_back_on_the_next_rescue_pass_or_at_once_on_request(
    screen: Screen,
) -> None:
    """A worker (or Redis) that died between RQ's move of a job id and the job's start: a rescuer's second
    pass puts it back (no clock involved), a one-off recovery (`pool-enqueue`) at once."""
    from rq import Queue

    screen.enqueue_chunks(1, IDS, 5)
    for _ in range(2):  # both jobs moved, neither started
        assert Queue.dequeue_any([screen.queue(1)], None, connection=screen.conn, serializer=JSONSerializer)
    seen: set[str] = set()
    assert rescue(screen.conn, [screen.queue(1)], seen) == 0 and len(seen) == 2  # first seen now
    assert rescue(screen.conn, [screen.queue(1)], seen) == 2 and not seen
    assert screen.conn.llen(screen.queue(1).intermediate_queue_key) == 0
    assert Queue.dequeue_any([screen.queue(1)], None, connection=screen.conn, serializer=JSONSerializer)
    assert rescue(screen.conn, [screen.queue(1)]) == 1  # pool-enqueue: at once
    assert {take(screen).job.id for _ in range(2)} == set(screen.snapshot([1])[1].running)


def test_putting_back_an_id_a_live_worker_is_starting_runs_the_job_once(
    screen: Screen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harmless race of an at-once rescue: the id goes back while its worker starts the job; the
    worker still runs it, and the second copy of the id is passed over by the next worker."""
    from rq import Queue

    real = Queue.dequeue_any

    def racing(*args: object, **kwargs: object) -> object:
        got = real(*args, **kwargs)  # type: ignore[arg-type]
        rescue(screen.conn, [screen.queue(1)])  # pool-enqueue --step all, in that instant
        return got

    screen.enqueue_chunks(1, IDS[:5], 5)
    monkeypatch.setattr(Queue, "dequeue_any", staticmethod(racing))
    first = take(screen)
    monkeypatch.setattr(Queue, "dequeue_any", real)
    assert screen.conn.lrange(screen.queue(1).key, 0, -1) == [first.job.id.encode()]  # the second copy
    assert lease.claim(screen, [screen.queue(1)], "w2", 30) is None  # passed over: it runs once
    assert lease.finish(screen, first, [], 2)


@pytest.mark.parametrize("skew_s", [-120, 120])
@pytest.mark.slow
def test_a_node_whose_clock_is_minutes_off_holds_leases_on_redis_time(
    screen: Screen, monkeypatch: pytest.MonkeyPatch, skew_s: int
) -> None:
    """RQ writes a lease's expiry from the local clock: a node 2 minutes behind would have its healthy jobs
    re-queued by every rescue, one 2 minutes ahead would hold dead jobs 2 minutes too long. Our leases are
    written and judged on Redis's clock, whatever the node's."""
    import rq.executions
    import rq.registry

    real = rq.registry.current_timestamp
    for mod in (rq.registry, rq.executions):
        monkeypatch.setattr(mod, "current_timestamp", lambda: real() + skew_s)  # this node's clock
    screen.enqueue_chunks(1, IDS[:5], 5)
    before = redis_now(screen.conn)
    held = take(screen, lease_s=2)
    after = redis_now(screen.conn)
    reg = screen.queue(1).started_job_registry
    expiry = screen.conn.zscore(reg.key, held.execution.composite_key)
    assert expiry is not None and before + 2 <= expiry <= after + 2  # Redis's clock at the claim, not this node's
    for _ in range(6):  # 3 s, longer than the lease: heartbeats keep it, whatever this clock says
        time.sleep(0.5)
        lease.heartbeat(screen.conn, [held], 2)
        assert rescue(screen.conn, [screen.queue(1)]) == 0
    monkeypatch.undo()  # the rescuer's own clock is right: it still judges on Redis's
    time.sleep(2.5)  # no more heartbeats: the worker died
    assert rescue(screen.conn, [screen.queue(1)]) == 1
