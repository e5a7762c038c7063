"""A user's mistakes, each answered with one line that names the problem and exit 2, and no wait where
no wait would help."""

from __future__ import annotations

import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pool_queue.proc.procs import Procs, free_port, wait_health

pytestmark = pytest.mark.slow  # a screened stack, then several commands

BIN = Path(sys.executable).parent


def run(*argv: str, timeout: float = 120, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]


def one_line(out: subprocess.CompletedProcess[str]) -> str:
    """Exit 2, no traceback, one line (besides a worker's timestamped log lines)."""
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = [line for line in out.stderr.strip().splitlines() if not re.match(r"\d{4}-\d\d-\d\d ", line)]
    assert len(lines) == 1, out.stderr
    return lines[0]


@pytest.fixture()
def screened(pool_root: Path, procs: Procs, tmp_path: Path) -> tuple[Path, str]:
    """The small pool with step 1 screened (the commands below have rows to write out)."""
    redis = procs.redis(free_port(), tmp_path / "redis")
    sim = procs.sim("sim8", free_port(), "--profile", "qwen3-vl-8b", "--zero-latency")
    wait_health(sim, 30)
    flags = ("--root", str(pool_root), "--redis-url", redis)
    assert run("pool-enqueue", "--step", "1", *flags).returncode == 0
    assert run("pool-worker", "--server", sim, "--steps", "1", "--burst", *flags, timeout=300).returncode == 0
    return pool_root, redis


def test_a_wrong_redis_password_is_named_at_once_by_every_command(pool_root, procs, tmp_path):
    port = free_port()
    procs.redis(port, tmp_path / "redis", password="right-one")
    sim = procs.sim("sim8", free_port(), "--profile", "qwen3-vl-8b", "--zero-latency")
    wait_health(sim, 30)
    for bad in ("wrong-one", ""):  # a wrong password, and none for a Redis that wants one
        env = {"PATH": "/usr/bin:/bin", "REDIS_PASSWORD": bad, "POOL_ENV_FILE": ""}
        flags = ("--root", str(pool_root), "--redis-url", f"redis://127.0.0.1:{port}/0")
        for argv in (("pool-status", "--no-health"), ("pool-enqueue", "--step", "1"),
                     ("pool-worker", "--server", sim, "--wait-redis", "3600")):  # fmt: skip
            line = one_line(run(*argv, *flags, env=env))
            assert "Redis refused the password" in line and "REDIS_PASSWORD" in line, (argv, line)
            assert "right-one" not in line and (not bad or bad not in line), line


def test_an_output_path_that_cannot_be_written_is_one_line_naming_it(screened, tmp_path):
    root, redis = screened
    flags = ("--root", str(root), "--redis-url", redis)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    read_only = tmp_path / "ro"
    read_only.mkdir(mode=0o555)
    cases = [("pool-export", "/proc/forbidden"), ("pool-report", str(a_file)), ("pool-export", str(a_file)),
             ("pool-pack", str(a_file / "below-a-file"))]  # fmt: skip
    if not _root_ignores_modes(read_only):
        cases.append(("pool-report", str(read_only / "report")))
    for cmd, out in cases:
        line = one_line(run(cmd, "--out", out, *flags))
        assert out in line or str(Path(out).parent) in line, (cmd, line)


def test_a_full_disk_while_exporting_is_one_line(screened, tmp_path):
    """A full disk, without root: the file-size limit makes every write past 64 KiB fail as a full disk would."""
    root, redis = screened

    def small_disk() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails (EFBIG) instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    out = run("pool-export", "--out", str(tmp_path / "export"), "--root", str(root), "--redis-url", redis,
              preexec_fn=small_disk)  # fmt: skip
    line = one_line(out)
    assert str(tmp_path / "export") in line and "File too large" in line, line


def test_remaining_total_of_a_step_is_zero_only_when_the_step_is_complete(pool_root, procs, tmp_path):
    redis = procs.redis(free_port(), tmp_path / "redis")
    flags = ("--root", str(pool_root), "--redis-url", redis)
    before = run("pool-enqueue", "--step", "2", "--plan-only", *flags)
    assert before.returncode == 0, before.stderr
    total = int(before.stdout.split("REMAINING_TOTAL=")[1].split()[0])
    assert 0 < total <= 240, before.stdout  # an upper bound: the items that may still pass step 1
    said = " ".join(before.stderr.split())
    assert "step 1 is not complete" in said, before.stderr
    assert f"up to {total} more item(s) may become eligible (items an earlier step has not settled yet" in said, said
    status = run("pool-status", "--no-health", *flags)
    assert f"STEP=2 REMAINING_TOTAL={total}" in status.stdout, status.stdout


def _root_ignores_modes(path: Path) -> bool:
    try:
        (path / ".probe").write_text("")
    except PermissionError:
        return False
    (path / ".probe").unlink()
    return True
