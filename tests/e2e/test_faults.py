"""The faults of a shared cluster, with real processes under compressed time: a server that hangs
without dying (stopped, or a port that accepts and never replies), a results disk that refuses rows,
and Redis at its maxmemory. Each ends with every item screened once, no item charged an error, every
segment readable line by line, and the audit clean."""

from __future__ import annotations

import os
import resource
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pyarrow.compute as pc
import pytest
from stack import FAST, Stack, cli, expected, running

pytestmark = pytest.mark.slow  # a stack: Redis, simulators, workers

# request timeout 2 s: a server that answers no forward for 2 x 2 s has its worker's jobs moved
SILENT = {**FAST, "POOL_REQUEST_TIMEOUT_S": "2"}


def wait_for(what: Callable[[], bool], timeout: float, why: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, why()
        time.sleep(0.1)


def rows_by(stack: Stack, prefix: str, step: int = 1) -> int:
    """Rows in the store written by workers named `prefix`."""
    return sum(1 for seg in stack.store.index(step).column("segment").to_pylist() if seg.startswith(f"seg-{prefix}."))


def jobs_of(stack: Stack, prefix: str) -> int:
    return sum(1 for j in running(stack).values() if (j.worker_name or "").startswith(prefix + "."))


def assert_complete_and_clean(stack: Stack) -> None:
    """Step 1 screened whole, no error row anywhere, every line of every segment whole, audit clean."""
    want = expected(stack.root)[1]
    got = stack.winners(1)
    assert {k: (r["status"], r["removed"]) for k, r in got.items()} == {k: ("ok", v[0]) for k, v in want.items()}
    assert pc.sum(pc.equal(stack.store.index(1).column("status"), "error")).as_py() in (None, 0)
    for seg in stack.store.segments(1):
        data = seg.read_bytes()
        assert not data or data.endswith(b"\n"), seg
        for line in data.splitlines():
            orjson.loads(line)
    audit = cli(stack, str(Path(sys.executable).parent / "pool-audit"))
    assert audit.returncode == 0, audit.stdout + audit.stderr


def mute_listener(port: int) -> socket.socket:
    """A port that accepts connections and never replies (a wedged server's, or a stopped one's)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(256)
    return sock


def test_a_silent_server_gives_its_jobs_back_and_its_worker_takes_work_again_once_it_answers(stack):
    a = stack.sim("simA", "qwen3-vl-8b", "--max-num-seqs", "2", "--speed", "0.15")
    b = stack.sim("simB", "qwen3-vl-8b", "--max-num-seqs", "2", "--speed", "0.15")
    stack.enqueue(1, chunk_size=8)
    wa = stack.worker("wa", a, "--steps", "1", "--inflight", "2", env=SILENT)
    stack.worker("wb", b, "--steps", "1", "--inflight", "2", env=SILENT)
    wait_for(lambda: rows_by(stack, "wa") >= 16 and jobs_of(stack, "wa") > 0, 120, lambda: stack.log("wa"))
    sim_a = stack.procs.children["simA"]
    os.killpg(sim_a.pid, signal.SIGSTOP)  # hung, not dead: its port still accepts connections
    wait_for(lambda: "answered no forward" in stack.log("wa"), 60, lambda: stack.log("wa"))
    wait_for(lambda: jobs_of(stack, "wa") == 0, 10, lambda: stack.log("wa"))  # given back, not left to expire
    st = cli(stack, str(Path(sys.executable).parent / "pool-status"), "--json", "--no-health")
    held = {w["name"].split(".")[0]: w["held"] for w in orjson.loads(st.stdout)["workers"]}
    assert "answered no forward" in (held["wa"] or "") and held["wb"] is None, held  # pool-status says why
    os.killpg(sim_a.pid, signal.SIGCONT)
    wait_for(lambda: "taking work again" in stack.log("wa"), 60, lambda: stack.log("wa"))
    before = rows_by(stack, "wa")
    wait_for(lambda: rows_by(stack, "wa") >= before + 8 and jobs_of(stack, "wa") > 0, 60, lambda: stack.log("wa"))
    # now the server dies and something on its port accepts connections and never replies
    port = int(a.rsplit(":", 1)[1])
    stack.procs.stop("simA", signal.SIGKILL)
    with mute_listener(port):
        wait_for(lambda: stack.log("wa", 10**6).count("answered no forward") == 2, 60, lambda: stack.log("wa"))
        wait_for(lambda: len(stack.winners(1)) == len(expected(stack.root)[1]), 240, lambda: stack.log("wb"))
        assert wa.poll() is None  # it waits for its server, holding nothing
        assert jobs_of(stack, "wa") == 0
    log = stack.log("wa", 10**6)
    assert "Traceback" not in log and log.count("taking work again") == 1, log[-3000:]
    assert_complete_and_clean(stack)


def test_a_results_disk_that_refuses_rows_holds_the_worker_and_loses_nothing(stack):
    """A file-size limit (RLIMIT_FSIZE, no root needed) makes every append fail with EFBIG mid-run, as a
    full or read-only disk would: the worker says so once, gives its jobs back and probes; once the
    limit is lifted it takes work again. Its log goes to a pipe, which no file-size limit touches."""
    a = stack.sim("simA", "qwen3-vl-8b", "--max-num-seqs", "4", "--speed", "0.3")
    b = stack.sim("simB", "qwen3-vl-8b", "--max-num-seqs", "2", "--speed", "0.15")
    stack.enqueue(1, chunk_size=8)
    argv = [sys.executable, "-m", "workers.main", "--server", a, "--name", "wdisk", "--steps", "1"]
    proc, log = stack.piped_worker("wdisk", argv, FAST)
    stack.worker("wb", b, "--steps", "1", "--inflight", "2", env=FAST)
    wait_for(lambda: rows_by(stack, "wdisk") >= 16 and jobs_of(stack, "wdisk") > 0, 120, log)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (1, hard))  # no file of its may grow past 1 byte
    wait_for(lambda: "cannot write rows to" in log(), 60, log)
    wait_for(lambda: jobs_of(stack, "wdisk") == 0, 10, log)
    held = rows_by(stack, "wdisk")
    time.sleep(3 * float(FAST["POOL_LEASE_S"]))  # held: it probes, writes nothing, takes nothing
    assert rows_by(stack, "wdisk") == held and proc.poll() is None
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (soft, hard))  # space is back
    wait_for(lambda: "taking work again" in log(), 60, log)
    wait_for(lambda: len(stack.winners(1)) == len(expected(stack.root)[1]), 240, log)
    text = log()
    assert text.count("cannot write rows to") == 1 and "File too large" in text and "Traceback" not in text, text
    assert_complete_and_clean(stack)


def test_redis_at_its_maxmemory_is_waited_out_and_named(stack):
    """Redis refusing writes (maxmemory, noeviction) mid-run: the workers wait with one line each and go
    on when memory is raised; a one-off command that must write names the condition in one line, exit 2."""
    a = stack.sim("simA", "qwen3-vl-8b", "--max-num-seqs", "4", "--speed", "0.3")
    first = stack.enqueue(1, chunk_size=8, limit=120)  # the rest is left for the command below to enqueue
    assert first.remaining > first.items > 0
    w = stack.worker("wa", a, "--steps", "1", env=FAST)
    wait_for(lambda: stack.raw_count(1) >= 40, 120, lambda: stack.log("wa"))
    stack.conn.config_set("maxmemory-policy", "noeviction")
    stack.conn.config_set("maxmemory", 1)  # below what it holds: every write is refused with OOM
    wait_for(lambda: "is at its maxmemory" in stack.log("wa"), 60, lambda: stack.log("wa"))
    enq = cli(stack, str(Path(sys.executable).parent / "pool-enqueue"), "--step", "1")
    assert enq.returncode == 2 and "maxmemory" in enq.stderr and "Traceback" not in enq.stderr, enq.stderr
    time.sleep(3 * float(FAST["POOL_LEASE_S"]))  # longer than a lease: leases cannot be renewed, nor jobs rescued
    assert w.poll() is None
    stack.conn.config_set("maxmemory", 0)
    assert stack.enqueue(1, chunk_size=8).items > 0  # what the refused command could not enqueue
    wait_for(lambda: len(stack.winners(1)) == len(expected(stack.root)[1]), 240, lambda: stack.log("wa"))
    log = stack.log("wa", 10**6)
    assert log.count("is at its maxmemory") == 1 and "is back after" in log and "Traceback" not in log, log[-3000:]
    assert_complete_and_clean(stack)
