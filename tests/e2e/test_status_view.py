"""pool-status as a person reads it: 80 columns with nothing cut, and plain lines when not on a terminal."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from craft import items_of, row, write
from rich.console import Console
from rq import Worker
from stack import cli

from pool_queue.commands.status import plain_lines, render
from pool_queue.observe import presence
from pool_queue.observe.prefix_cache import Engine
from pool_queue.observe.status import RunStatus, ServerStatus, StepStatus, WorkerStatus

BIN = Path(sys.executable).parent


def _status() -> RunStatus:
    steps = [
        StepStatus(
            step=s,
            eligible=299_366,
            done=123_456,
            ok=120_000,
            removed=65_432,
            errors=3_456,
            remaining=175_910,
            queued_jobs=2_000,
            queued_items=128_000,
            running_jobs=40,
            running_items=2_560,
            failed_jobs=0,
            items_per_s_1m=1234.5,
            items_per_s_5m=1111.1,
            eta_s=158.4 * 3600,
            workers=2,
            prefix_cache_hit_rate=0.634,
        )
        for s in (1, 2, 3)
    ]
    w = WorkerStatus(
        name="gpu3-node-with-a-long-hostname.cluster.example.org.a1b2c3", screen="s", server="http://10.0.12.34:8004",
        steps=[3], host="node", pid=1, max_inflight=256, inflight=1024, inflight_cost=256.0, active_jobs=3, items=1,
        forwards=1, errors=12, removed=0, retries=0, items_per_s=25.5, forwards_per_s=25.5, outage_s=0.0,
        server_up=True,
        last_error="item vmme-000123: HTTP 400: This model's maximum context length is 8192 tokens, more words here",
        started_at=0.0, updated_at=0.0, health=True,
        held="http://10.0.12.34:8004 answered no forward for 241 s (POOL_SERVER_SILENT_S 240 s)",
    )  # fmt: skip
    engine = Engine(running=64, waiting=4321, tokens_per_step=31234.5, steps=80, kv_cache_usage=0.876,
                    processor_cache_hit_rate=0.5)  # fmt: skip
    server = ServerStatus(server="http://10.0.12.34:8004", steps=[3], engine=engine)
    return RunStatus(at=time.time(), results="/scratch/user/some/long/path/pool/results/pool", screen="0123456789",
                     steps=steps, workers=[w], servers=[server])  # fmt: skip


def test_the_view_fits_80_columns_and_cuts_nothing():
    con = Console(width=80, record=True, force_terminal=False)
    con.print(render(_status()))
    text = con.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    for want in ("299,366", "123,456", "65,432", "128,000", "2,560", "1111.1", "6d 14h", "63%", "25.5", "256/256",
                 "4321", "31,234", "88%", "50%"):  # fmt: skip
        assert want in text, want
    joined = "".join(text.split())  # wrapped, not cut
    assert "gpu3-node-with-a-long-hostname.cluster.example.org.a1b2c3" in joined
    assert "moreword" in joined and "http://10.0.12.34:8004" in joined
    assert "takesnowork:http://10.0.12.34:8004answerednoforwardfor241s" in joined  # a held worker says why
    assert "256/256(1024sent)" in joined  # the bound by cost, and the forwards it lets in
    assert "abatch'ssiblingsreuseitsframesandcostaboutoneframeeach" in joined  # said under the table


def test_plain_lines_say_everything_on_one_line_per_step():
    lines = plain_lines(_status()).splitlines()
    assert len(lines) == 4
    assert "step 1: done 123,456/299,366" in lines[0] and "prefix-cache hits 63%" in lines[0]
    assert lines[3].endswith("http://10.0.12.34:8004 (step 3): 64 running, 4321 waiting, 31,234 tokens/step, KV 88%, "
                             "mm cache 50%")  # fmt: skip


@pytest.mark.slow
def test_watch_into_a_pipe_prints_a_line_per_step_and_refresh(pool_root):
    argv = [str(Path(sys.executable).parent / "pool-status"), "--root", str(pool_root), "--watch", "0.5",
            "--no-health", "--redis-url", "redis://127.0.0.1:9/0"]  # fmt: skip
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as p:
        assert p.stdout is not None
        got = [p.stdout.readline() for _ in range(8)]  # two refreshes of three steps and the Redis it misses
        p.terminate()
    refresh = [["step"]] * 3 + [["Redis"]]
    assert [line.split(" ", 2)[1:2] for line in got] == refresh * 2 and "step 3:" in got[6], got


@pytest.mark.slow
def test_a_worker_shows_up_at_once_not_one_heartbeat_later(stack, pool_root, tmp_path):
    """The demo's step-3 worker appeared ~14 s after the others: presence waited for the first heartbeat."""
    url = stack.sim("sim2", "qwen3-vl-2b")
    t0 = time.monotonic()
    stack.worker("w3", url, env={"POOL_HEARTBEAT_S": "3000", "POOL_LEASE_S": "6000"})  # no heartbeat in this test
    while not presence.read_all(stack.conn):
        assert time.monotonic() - t0 < 120, stack.log("w3")
        time.sleep(0.2)
    (snap,) = presence.read_all(stack.conn)
    assert snap.steps == [3] and snap.server == url


def test_with_no_live_worker_the_eta_says_so_instead_of_counting_down():
    st = _status()
    st.steps[2] = st.steps[2].model_copy(update={"workers": 0, "eta_s": None})
    st.steps[0] = st.steps[0].model_copy(update={"workers": 0, "remaining": 0, "done": 299_366})
    lines = plain_lines(st).splitlines()
    assert "ETA no workers" in lines[2] and "ETA done" in lines[0] and "ETA 6d 14h" in lines[1]
    con = Console(width=80, record=True, force_terminal=False)
    con.print(render(st))
    text = con.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80 and "step 3: work left and no workers, so no ETA" in text


def test_with_redis_away_the_eta_is_unknown_not_a_count_down_of_the_last_rate():
    """A stopped screen's last rows keep a 5-minute rate; with Redis away no worker is known to take the step."""
    st = _status()
    st.redis_error = "127.0.0.1:6379: Connection refused"
    st.workers = []
    st.steps = [s.model_copy(update={"workers": None}) for s in st.steps]
    st.steps[0] = st.steps[0].model_copy(update={"remaining": 0, "done": 299_366})
    lines = plain_lines(st).splitlines()
    assert ["ETA done" in lines[0], "ETA unknown" in lines[1], "ETA unknown" in lines[2]] == [True] * 3, lines
    con = Console(width=80, record=True, force_terminal=False)
    con.print(render(st))
    table = con.export_text()
    etas = {r.split()[0]: r.split()[9] for r in table.splitlines() if r.split()[:1] in (["1"], ["2"], ["3"])}
    assert etas == {"1": "done", "2": "?", "3": "?"}, table


@pytest.mark.slow
def test_rq_shows_a_worker_busy_while_it_holds_jobs_and_idle_once_it_holds_none(stack):
    """RQ's view of our worker (`rq info`, rq-dashboard: `Worker.all()`) follows its jobs, not its heartbeats:
    busy, naming a current job, from the claim of its first job; idle once its last one ended. Both before its
    next heartbeat (100 s apart here), so every change seen carries the heartbeat of the worker's start."""
    url = stack.sim("sim", "qwen3-vl-8b", "--speed", "0.2")
    stack.enqueue(1, chunk_size=4, limit=12)
    jobs = set(stack.screen.queue(1).job_ids)
    stack.worker("w", url, "--steps", "1", "--inflight", "8", env={"POOL_HEARTBEAT_S": "100", "POOL_LEASE_S": "300"})
    seen: list[tuple[str, object]] = []  # (state, last heartbeat), each change once
    named: set[str | None] = set()  # the current jobs RQ names while it shows the worker busy
    said = ""
    deadline = time.monotonic() + 90
    while not (seen and seen[-1][0] == "idle" and "busy" in [s for s, _ in seen]) and time.monotonic() < deadline:
        for w in Worker.all(connection=stack.conn):
            if seen[-1:] != [(w.get_state(), w.last_heartbeat)]:
                seen.append((w.get_state(), w.last_heartbeat))
            if w.get_state() == "busy":
                named.add(w.get_current_job_id())
                said = said or cli(stack, str(BIN / "rq"), "info", "-u", stack.redis_url, "-W").stdout
        time.sleep(0.05)
    shown = [s for s, _ in seen if s != "starting"]  # RQ's own state between its birth and our first write
    assert shown in (["busy", "idle"], ["idle", "busy", "idle"]), seen
    assert len({beat for s, beat in seen if s != "starting"}) == 1, seen  # no heartbeat in between
    assert named & jobs, (named, jobs)
    assert re.search(r"^w\.\S+ \(.*\): busy pool-\w+-step1\.", said, re.M), said
    after = cli(stack, str(BIN / "rq"), "info", "-u", stack.redis_url, "-W").stdout
    assert re.search(rf"^w\.\S+ \(.*\): idle .*jobs: {len(jobs)} finished, 0 failed", after, re.M), after


@pytest.mark.slow
def test_status_names_the_window_of_each_rate_and_agrees_with_the_report(pool_root, redis_url, tmp_path):
    """A step that worked 100 s, paused ~13 min, then worked again 51 s: its rate over the last 5 minutes
    (pauses included, the ETA's) and its rate while working (pool-report's items/s) differ, and pool-status says
    which is which; the rate it names as the report's is the number `pool-report` prints."""
    items, now = items_of(pool_root), time.time()
    early = [row(it, 1, t=now - 1000 + i) for i, it in enumerate(items[:100])]
    late = [row(it, 1, t=now - 100 + i) for i, it in enumerate(items[100:150])]
    write(pool_root, 1, early + late)
    status = [str(BIN / "pool-status"), "--root", str(pool_root), "--redis-url", redis_url, "--no-health"]
    out = subprocess.run(status, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "/s 5m: a step's items of the last 5 min (since its first row, if later) per second, pauses included" in text
    working = re.search(r"while working, as pool-report's items/s \(pauses over 10 s left out\): step 1 (\S+),", text)
    assert working and working[1] == f"{150 / 151:.1f}", text  # 150 rows over 100 + 51 busy seconds
    js = subprocess.run([*status, "--json"], capture_output=True, text=True, timeout=120)
    step1 = orjson.loads(js.stdout)["steps"][0]  # the late 50 over the last 300 s; 150 over 151 busy seconds
    assert (round(step1["items_per_s_5m"], 2), f"{step1['items_per_s_working']:.1f}") == (0.17, working[1]), step1
    report = subprocess.run([str(BIN / "pool-report"), "--root", str(pool_root), "--out", str(tmp_path / "rep")],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert report.returncode == 0, report.stderr
    table = (tmp_path / "rep" / "report.md").read_text().split("## Return report", 1)[1]
    cells = next(line.split("|") for line in table.splitlines() if line.startswith("| 1 |"))
    assert cells[7].strip() == working[1], table  # the report's items/s, step 1
    plain = subprocess.Popen([*status, "--watch", "0.5"], stdout=subprocess.PIPE, text=True)
    assert plain.stdout is not None
    first = plain.stdout.readline()
    plain.terminate()
    plain.wait(30)
    assert f"/s over 5m, {working[1]}/s while working, ETA " in first, first  # no worker: no 5-minute rate


@pytest.mark.slow
def test_a_worker_that_redis_lost_is_listed_by_rq_again(stack):
    """Redis flushed under a busy worker: its next heartbeat registers it again, whole, however its jobs end
    meanwhile (the state it shows never stands in for the worker RQ lists)."""
    url = stack.sim("sim", "qwen3-vl-8b", "--speed", "0.5")
    stack.enqueue(1, chunk_size=4, limit=40)
    stack.worker("w", url, "--steps", "1", "--inflight", "8", env={"POOL_HEARTBEAT_S": "8", "POOL_LEASE_S": "20"})
    deadline = time.monotonic() + 60
    while not any(w.get_state() == "busy" for w in Worker.all(connection=stack.conn)):
        assert time.monotonic() < deadline, stack.log("w")
        time.sleep(0.05)
    stack.conn.flushall()  # its jobs end as not its own any more, each a change of what it holds
    while not (listed := Worker.all(connection=stack.conn)):
        assert time.monotonic() < deadline + 60, stack.log("w")
        time.sleep(0.1)
    assert [w.name.split(".")[0] for w in listed] == ["w"] and listed[0].birth_date is not None, listed


def test_a_server_whose_engine_is_not_read_yet_is_named_under_the_engines():
    st = _status()
    con = Console(width=80, record=True, force_terminal=False)
    con.print(render(st))
    assert "no engine view" not in con.export_text()  # its one server is in the table
    other = st.workers[0].model_copy(update={"server": "http://10.0.12.35:8000", "engine": None})
    st.workers.append(other)
    con = Console(width=200, record=True, force_terminal=False)
    con.print(render(st))
    assert "no engine view of http://10.0.12.35:8000 yet: none of its workers has reported a read of its /metrics" in (
        con.export_text()
    )
