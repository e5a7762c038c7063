"""Waits a person can see and stop: every wait of a worker ends on the first SIGTERM or Ctrl-C when nothing
is in flight, says so again while it lasts, and a wait that cannot help (a wrong password, a URL with a
path, a /health that is not there) is refused at once. pool-status and pool-demo say what they cannot see.

No assertion reads the clock: the bounds below are test timeouts only; waits are seen in their lines."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pool_queue.proc.procs import Procs, free_port, wait_health

pytestmark = pytest.mark.slow  # workers, simulators and commands that wait, or are stopped while they wait

BIN = Path(sys.executable).parent
PATIENCE_S = 120.0  # a test timeout only: how long a line or an exit may take on a busy 2-core box


def run(*argv: str, timeout: float = PATIENCE_S, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})  # fmt: skip


def one_line(out: subprocess.CompletedProcess[str]) -> str:
    """Exit 2, no traceback, one line besides a worker's timestamped log lines."""
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = [line for line in out.stderr.strip().splitlines() if not re.match(r"\d{4}-\d\d-\d\d ", line)]
    assert len(lines) == 1, out.stderr
    return lines[0]


@contextmanager
def worker(
    tmp_path: Path, *argv: str, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], Callable[[], str]]]:
    """A pool-worker whose log goes to a file (never a pipe that could fill), and a reader of that log."""
    log = tmp_path / "worker.log"
    with log.open("w") as out, subprocess.Popen([str(BIN / "pool-worker"), *argv], stdout=out, stderr=out, text=True,
                                                env={**os.environ, **(env or {})}) as p:  # fmt: skip
        try:
            yield p, log.read_text
        finally:
            if p.poll() is None:
                p.kill()


def until(read: Callable[[], str], pattern: str, count: int = 1) -> list[str]:
    """Wait until the log holds `count` lines matching `pattern`; those lines."""
    deadline = time.monotonic() + PATIENCE_S  # a test timeout, never an assertion on how long it took
    while True:
        found = [line for line in read().splitlines() if re.search(pattern, line)]
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline, f"no {count} line(s) {pattern!r} in:\n{read()[-3000:]}"
        time.sleep(0.1)


def stopped_by_one(p: subprocess.Popen[str], read: Callable[[], str], sig: int) -> None:
    """One signal, and the worker is gone: exit 0, the reason said, no traceback."""
    p.send_signal(sig)
    try:
        code = p.wait(PATIENCE_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after one signal:\n{read()[-3000:]}")
    text = read()
    assert code == 0 and "Traceback" not in text, text[-3000:]
    assert "signal received: nothing in flight, stopping" in text, text[-3000:]


@pytest.fixture()
def sim(procs: Procs) -> str:
    url = procs.sim("sim8", free_port(), "--profile", "qwen3-vl-8b", "--zero-latency")
    wait_health(url, 30)
    return url


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_waiting_for_redis_at_its_start_ends_on_the_first_signal(pool_root, sim, tmp_path, sig):
    down = f"redis://127.0.0.1:{free_port()}/0"
    with worker(tmp_path, "--root", str(pool_root), "--server", sim, "--redis-url", down) as (p, read):
        until(read, f"Redis at {re.escape(down)} unreachable")
        stopped_by_one(p, read, sig)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_waiting_for_its_server_ends_on_the_first_signal(pool_root, tmp_path, sig):
    server = f"http://127.0.0.1:{free_port()}"
    with worker(tmp_path, "--root", str(pool_root), "--server", server) as (p, read):
        until(read, "waiting up to 3600 s for the vLLM server")
        stopped_by_one(p, read, sig)


def test_a_wait_that_lasts_says_so_at_each_interval_with_what_it_waits_for_and_its_bound(pool_root, sim, tmp_path):
    """POOL_WAIT_NOTE_S shortens the minute: the lines are counted, never timed."""
    env = {"POOL_WAIT_NOTE_S": "0.3"}
    server = f"http://127.0.0.1:{free_port()}"
    with worker(tmp_path, "--root", str(pool_root), "--server", server, "--wait-server", "7200", env=env) as (p, read):
        lines = until(read, "still waiting for the vLLM server", 3)
        assert all(re.search(r": \dm \d\ds so far, gives up after 2h 00m$", line) for line in lines), lines
        stopped_by_one(p, read, signal.SIGTERM)
    down = f"redis://127.0.0.1:{free_port()}/0"
    argv = ("--root", str(pool_root), "--server", sim, "--redis-url", down, "--wait-redis", "600")
    with worker(tmp_path, *argv, env=env) as (p, read):
        lines = until(read, f"still waiting for Redis at {re.escape(down)}", 3)
        assert all(line.endswith("so far, gives up after 10m 00s") for line in lines), lines
        stopped_by_one(p, read, signal.SIGTERM)
    assert len(re.findall("unreachable", read())) == 1  # the outage itself is said once, not per probe


def test_a_wrong_redis_password_is_named_before_the_server_is_waited_for(pool_root, procs, tmp_path):
    port = free_port()
    procs.redis(port, tmp_path / "redis", password="right-one")
    server = f"http://127.0.0.1:{free_port()}"  # nothing there: today's wait would be an hour
    for bad in ("wrong-one", ""):
        out = run("pool-worker", "--root", str(pool_root), "--server", server, "--redis-url",
                  f"redis://127.0.0.1:{port}/0", env={"REDIS_PASSWORD": bad})  # fmt: skip
        line = one_line(out)
        assert "Redis refused the password" in line and "right-one" not in line, line
        assert "waiting up to" not in out.stderr, out.stderr  # named before any wait began


def test_a_server_url_with_a_path_is_refused_naming_the_base_url(pool_root):
    port = free_port()
    line = one_line(run("pool-worker", "--root", str(pool_root), "--server", f"http://127.0.0.1:{port}/v1"))
    assert line.endswith(f"without a path: http://127.0.0.1:{port}"), line


class _NoHealth(BaseHTTPRequestHandler):
    """An HTTP server that is not vLLM: every path answers 404."""

    def do_GET(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


def test_a_health_that_answers_404_is_refused_at_once(pool_root):
    http = ThreadingHTTPServer(("127.0.0.1", 0), _NoHealth)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{http.server_address[1]}"
        line = one_line(run("pool-worker", "--root", str(pool_root), "--server", url))  # no --burst: no 30 s cap
    finally:
        http.shutdown()
    assert f"{url}/health answers HTTP 404" in line and "http://HOST:PORT" in line, line


@pytest.fixture()
def screened(pool_root: Path, procs: Procs, sim: str, tmp_path: Path) -> tuple[Path, str]:
    """Step 1 screened by a worker that has stopped since."""
    redis = procs.redis(free_port(), tmp_path / "redis")
    flags = ("--root", str(pool_root), "--redis-url", redis)
    assert run("pool-enqueue", "--step", "1", *flags).returncode == 0
    done = run("pool-worker", "--server", sim, "--steps", "1", "--burst", *flags, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return pool_root, redis


def watch_lines(*argv: str) -> list[str]:
    """pool-status --watch into a pipe: its first refresh, a line per step and any line after them."""
    with subprocess.Popen([str(BIN / "pool-status"), "--watch", "30", "--no-health", *argv], stdout=subprocess.PIPE,
                          text=True) as p:  # fmt: skip
        assert p.stdout is not None
        lines = [p.stdout.readline() for _ in range(3)]
        p.terminate()
        lines += p.stdout.read().splitlines()
    return [line.strip() for line in lines]


def test_pool_status_with_redis_gone_says_so_in_lines_and_in_json(screened):
    root, _ = screened
    down = ("--root", str(root), "--redis-url", f"redis://127.0.0.1:{free_port()}/0")
    lines = watch_lines(*down)
    assert all("queue unknown" in line and "workers ?" in line for line in lines[:3]), lines
    assert "?" not in " ".join(line.split(";")[0] for line in lines[:3]), lines  # no "queued ?, running ?"
    assert all("ETA done" in line or "ETA unknown" in line for line in lines[:3]), lines  # no count-down
    assert any("Redis unreachable: " in line for line in lines), lines
    out = run("pool-status", "--json", "--no-health", *down)
    assert out.returncode == 0, out.stderr
    st = json.loads(out.stdout)
    assert st["redis_error"] and st["steps"][0]["queued_items"] is None and st["steps"][0]["workers"] is None


def test_pool_status_shows_no_rate_for_a_step_no_live_worker_takes(screened):
    root, redis = screened
    lines = watch_lines("--root", str(root), "--redis-url", redis)
    step1 = lines[0]
    assert "step 1: done 240/240" in step1 and ", -/s over 5m, " in step1 and "workers 0" in step1, lines
    assert "/s while working, ETA done" in step1, lines  # the report's rate: the rows are there
    assert "Redis unreachable" not in " ".join(lines), lines


def test_pool_demo_into_a_pipe_prints_progress_lines_while_it_screens(tmp_path):
    argv = ["pool-demo", "--root", "demo", "--items", "60", "--videos", "12", "--speed", "20", "--progress-every", "0"]
    env = {k: v for k, v in os.environ.items() if k != "POOL_ENV_FILE"}
    out = subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    progress = [line for line in out.stderr.splitlines() if line.startswith("screening ")]
    # the watch polls until the queues stayed empty three times: a line each time, before the summary
    assert len(progress) >= 3, out.stderr[-3000:]
    assert all(re.fullmatch(r"screening \dm \d\ds: step 1 [\d,]+/60, step 2 [\d,]+/[\d,]+, step 3 .* done", line)
               for line in progress), progress  # fmt: skip
    assert progress[-1].startswith("screening ") and "step 1 60/60" in progress[-1], progress
