"""End to end over real Redis, real HTTP simulators and real worker processes."""

import signal
import time

import faulty_worker
import pytest
from stack import Stack, expected

from pool_queue.commands import enqueue
from pool_queue.inputs.items import load_items
from pool_queue.jobs.queue import cuts

pytestmark = pytest.mark.slow  # a stack: Redis, simulators, workers


def assert_matches_direct(stack: Stack) -> None:
    want = expected(stack.root)
    for step in (1, 2, 3):
        got = stack.winners(step)
        assert set(got) == set(want[step]), f"step {step}: items differ"
        for item_id, (removed, margin) in want[step].items():
            row = got[item_id]
            assert row["status"] == "ok", row
            assert row["removed"] == removed and row["margin"] == pytest.approx(margin, abs=1e-12), item_id
        assert stack.raw_count(step) == len(got), f"step {step}: duplicate rows"


def test_full_three_step_run_equals_direct_computation_and_chains(stack):
    s8a, s8b = stack.sim("sim8a", "qwen3-vl-8b", "--speed", "10"), stack.sim("sim8b", "qwen3-vl-8b", "--speed", "10")
    s2 = stack.sim("sim2", "qwen3-vl-2b", "--speed", "50")
    stack.enqueue(1)
    names = ["w8a", "w8b", "w2"]
    for n, url in zip(names, (s8a, s8b, s2), strict=True):
        stack.worker(n, url, "--burst")
    stack.wait_workers(names)
    # steps 2 and 3 were never enqueued by hand: chaining did it; a late worker drained what remained
    leftover = stack.queued()
    if leftover:
        stack.worker("w2-late", s2, "--burst")
        stack.worker("w8-late", s8a, "--burst")
        stack.wait_workers(["w2-late", "w8-late"])
    assert_matches_direct(stack)
    rows1 = stack.winners(1)
    r = next(iter(rows1.values()))
    assert r["n_perm"] == 4 and len(r["forwards"]) == 4 and all(len(f["top"]) == 20 for f in r["forwards"])
    assert r["fingerprint"] and r["revision"] and r["worker"].split(".")[0] in names
    # the simulator lists the batch endpoint: an item's orders, and a video's items, went as one request each
    assert {f["sent"] for f in r["forwards"]} == {"batch"}
    assert "batch" in {f["sent"] for step in (2, 3) for row in stack.winners(step).values() for f in row["forwards"]}
    for step in (1, 2, 3):
        stack.enqueue(step)  # nothing left: idempotent, enqueues nothing
    assert stack.queued() == 0


def test_enqueue_is_idempotent(stack, capsys):
    stack.enqueue(1, chunk_size=10)
    first = stack.waiting(1)
    stack.enqueue(1, chunk_size=10)
    stack.enqueue(1, chunk_size=7)
    items = load_items(stack.root / "items").items.sort_by([("video_id", "ascending"), ("item_id", "ascending")])
    whole_videos = cuts(items.num_rows, 10, items.column("video_id").to_pylist())  # chunks never split a video
    assert stack.waiting(1) == first == len(whole_videos) < 24
    enqueue.main(["--step", "1", "--plan-only", "--root", str(stack.root), "--redis-url", stack.redis_url])
    assert "REMAINING_TOTAL=240" in capsys.readouterr().out  # the command prints what the producer returns


def test_sigkill_mid_job_loses_and_duplicates_nothing(stack):
    url = stack.sim("sim8", "qwen3-vl-8b", "--max-num-seqs", "4")
    stack.enqueue(1, chunk_size=40)
    w = stack.worker("victim", url, "--steps", "1")
    deadline = time.monotonic() + 60
    while stack.raw_count(1) < 40 and time.monotonic() < deadline:  # wait until it is mid-run
        time.sleep(0.2)
    w.send_signal(signal.SIGKILL)
    w.wait()
    done_before = stack.raw_count(1)
    assert 0 < done_before < 240
    stack.worker("rescuer", url, "--steps", "1", "--burst")
    stack.wait_workers(["rescuer"], timeout=240)
    got = stack.winners(1)
    assert len(got) == 240 and all(r["status"] == "ok" for r in got.values())
    want = expected(stack.root)[1]
    assert {k: r["removed"] for k, r in got.items()} == {k: v[0] for k, v in want.items()}


def test_server_outage_charges_no_item(stack, tmp_path):
    from pool_queue.proc.procs import free_port

    port = free_port()
    url = stack.sim("flaky", "qwen3-vl-8b", "--max-num-seqs", "8", port=port)
    stack.enqueue(1)
    w = stack.worker("patient", url, "--steps", "1", "--burst")
    while stack.raw_count(1) < 30:
        time.sleep(0.1)
    stack.procs.stop("flaky", signal.SIGKILL)  # the server dies mid-run
    time.sleep(3)
    stack.sim("flaky", "qwen3-vl-8b", port=port)  # ...and comes back
    assert w.wait(240) == 0, stack.log("patient")
    got = stack.winners(1)
    assert len(got) == 240 and all(r["status"] == "ok" for r in got.values())
    assert all(f["attempts"] == 1 for r in got.values() for f in r["forwards"])
    log = stack.log("patient", tail=10**7)
    assert log.count("is down") == 1 and "is back after" in log and stack.raw_count(1) == 240


def test_transient_faults_are_retried_and_counted(stack):
    url = stack.sim(
        "faulty", "qwen3-vl-8b", "--faults", "500:0.05,429:0.03,reset:0.03,malformed:0.02", "--zero-latency"
    )
    stack.enqueue(1)
    stack.worker("retrier", url, "--steps", "1", "--burst")
    stack.wait_workers(["retrier"])
    got = stack.winners(1)
    assert len(got) == 240 and all(r["status"] == "ok" for r in got.values())
    retried = [f for r in got.values() for f in r["forwards"] if f["attempts"] > 1]
    assert retried and all(r["attempts"] == sum(f["attempts"] for f in r["forwards"]) for r in got.values())
    want = expected(stack.root)[1]
    assert {k: r["removed"] for k, r in got.items()} == {k: v[0] for k, v in want.items()}


def test_permanent_errors_become_rows_and_nothing_else_suffers(stack):
    # every step-1 forward fails permanently for ~3 % (no logprobs) and transiently forever for none
    url = stack.sim("bad", "qwen3-vl-8b", "--faults", "nologprobs:0.03", "--zero-latency")
    stack.enqueue(1)
    stack.worker("w", url, "--steps", "1", "--burst")
    stack.wait_workers(["w"])
    got = stack.winners(1)
    errs = [r for r in got.values() if r["status"] == "error"]
    assert len(got) == 240 and errs
    assert all(r["error_kind"] == "permanent" and "no logprobs" in r["error"] for r in errs)
    stack.enqueue(1)  # permanent errors are final: nothing to re-run
    assert stack.waiting(1) == 0


def test_exhausted_retries_are_rerun_by_a_later_enqueue(stack):
    url = stack.sim("down500", "qwen3-vl-8b", "--faults", "500:0.5", "--zero-latency")
    stack.enqueue(1, limit=20)
    fast = {"POOL_RETRY_BACKOFF_S": "0.01"}
    stack.worker("w1", url, "--steps", "1", "--burst", env=fast)
    stack.wait_workers(["w1"])
    errs = [r for r in stack.winners(1).values() if r["status"] == "error"]
    assert errs and all(r["error_kind"] == "transient" and "after 4 attempts" in r["error"] for r in errs)
    stack.enqueue(1)  # re-attempts the transient errors (and the rest of the pool)
    stack.worker("w2", url, "--steps", "1", "--burst", env=fast)
    stack.wait_workers(["w2"])
    assert len(stack.winners(1)) == 240


def test_redis_flushed_mid_run_reconciles_to_equal_results(stack):
    s8 = stack.sim("sim8", "qwen3-vl-8b", "--max-num-seqs", "8")
    s2 = stack.sim("sim2", "qwen3-vl-2b", "--speed", "50")
    stack.enqueue(1, chunk_size=16)
    w8, w2 = stack.worker("w8", s8), stack.worker("w2", s2)
    while stack.raw_count(1) < 60:
        time.sleep(0.1)
    stack.conn.flushall()  # Redis loses everything
    for p in (w8, w2):
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0
    for step in (1, 2, 3):  # reconcile from the store, step by step
        stack.enqueue(step)
        stack.worker(f"r8-{step}", s8, "--burst")
        stack.worker(f"r2-{step}", s2, "--burst")
        stack.wait_workers([f"r8-{step}", f"r2-{step}"])
    want = expected(stack.root)
    for step in (1, 2, 3):
        got = stack.winners(step)
        assert {k: r["removed"] for k, r in got.items()} == {k: v[0] for k, v in want[step].items()}


def test_worker_refuses_wrong_model(stack):
    url = stack.sim("other", "qwen3-vl-8b", "--served-model-name", "some/other-model")
    w = stack.worker("picky", url)
    assert w.wait(30) == 2
    assert "none of the protocol's models" in stack.log("picky")


def test_one_item_raising_inside_the_worker_costs_that_item_only(stack):
    from rq.registry import FailedJobRegistry, FinishedJobRegistry

    url = stack.sim("sim8", "qwen3-vl-8b", "--zero-latency")
    stack.enqueue(1, chunk_size=64)
    q = stack.screen.snapshot([1])[1]
    chunks = stack.screen.payloads(q.waiting)
    victim = chunks[q.waiting[0]].items[10]
    stack.worker("w", url, "--steps", "1", "--burst", wrapper=faulty_worker.command("--fault-items", victim))
    stack.wait_workers(["w"])
    got = stack.winners(1)
    bad = [r for r in got.values() if r["status"] == "error"]
    assert len(got) == 240 and [r["item_id"] for r in bad] == [victim]
    assert bad[0]["error_kind"] == "internal" and "RuntimeError: injected fault" in bad[0]["error"]
    assert stack.raw_count(1) == 240  # no forward sent twice, no row written twice
    queue = stack.screen.queue(1)
    assert sorted(FinishedJobRegistry(queue=queue).get_job_ids()) == sorted(q.waiting)  # each job once
    assert FailedJobRegistry(queue=queue).count == 0 and "raised (run" not in stack.log("w", tail=10**6)
    stack.enqueue(1)  # an internal error is re-attempted by a later run, like a transient one
    assert stack.waiting(1) == 1


def test_a_job_whose_items_all_have_rows_is_acknowledged_without_work(stack):
    """A re-taken or recovery-made job whose every item is already settled: nothing is sent or written,
    the job is acknowledged once, and its stored survivors still chain."""
    from rq.registry import FailedJobRegistry, FinishedJobRegistry

    url = stack.sim("sim8", "qwen3-vl-8b", "--zero-latency")
    stack.enqueue(1, chunk_size=240)
    stack.worker("w", url, "--steps", "1", "--burst")
    stack.wait_workers(["w"])
    screen, ids = stack.screen, sorted(stack.winners(1))
    step2 = stack.screen.snapshot([2])[2].waiting
    for jid in step2:  # as if the first run's follow-up never made it
        screen.queue(2).remove(jid)
        screen.fetch_many([jid])[0].delete()
    assert screen.enqueue_chunks(1, ids, 240, recheck=True) == 1  # the same chunk again, marked as a recovery's
    stack.worker("again", url, "--steps", "1", "--burst")
    stack.wait_workers(["again"])
    assert stack.raw_count(1) == 240 and FailedJobRegistry(queue=screen.queue(1)).count == 0
    assert screen.job_id(1, ids) in FinishedJobRegistry(queue=screen.queue(1)).get_job_ids()
    chained = [i for c in screen.payloads(screen.snapshot([2])[2].waiting).values() for i in c.items]
    assert chained and set(chained) <= set(ids)  # the survivors went on from the store


def test_settled_jobs_of_a_recovery_are_claimed_a_few_at_a_time(stack, monkeypatch):
    """After a recovery most jobs are settled already, and each re-check reads the whole step's index (at
    299,366 items a tenth of a second): a job counts its forwards while it is re-checked, so a worker holds
    what its in-flight bound allows. It used to claim them by the dozen, a re-check thread and an index copy
    each (8B workers past 2 GB in the full-size rehearsal). The worker runs in this process, its re-checks
    slowed to that size's pace."""
    import asyncio

    from rq.registry import FinishedJobRegistry

    from workers import main as worker_main
    from workers import runtime

    url = stack.sim("sim8", "qwen3-vl-8b", "--zero-latency")
    stack.enqueue(1, chunk_size=240)
    stack.worker("w", url, "--steps", "1", "--burst")
    stack.wait_workers(["w"])
    screen, ids = stack.screen, sorted(stack.winners(1))
    assert screen.enqueue_chunks(1, ids, 4, recheck=True) == 60  # 16 forwards a job

    def slow_recheck(*args):
        time.sleep(0.1)
        return real(*args)

    real = runtime.already_final
    monkeypatch.setattr(runtime, "already_final", slow_recheck)
    for k, v in stack.env.items():
        monkeypatch.setenv(k, v)
    argv = ["--server", url, "--name", "again", "--steps", "1", "--burst", "--inflight", "8"]  # claims stop at 16
    assert asyncio.run(worker_main._main(argv)) == 0
    assert stack.raw_count(1) == 240  # nothing sent again
    done = FinishedJobRegistry(queue=screen.queue(1)).get_job_ids()
    jobs = [j for j in screen.fetch_many(done) if j is not None and len(j.kwargs["items"]) == 4]
    assert len(jobs) == 60
    events = sorted([(j.started_at, 1) for j in jobs] + [(j.ended_at, -1) for j in jobs], key=lambda e: (e[0], e[1]))
    held = [sum(d for _, d in events[: k + 1]) for k in range(len(events))]
    assert max(held) <= 3  # one re-checked; one or two acknowledged meanwhile
