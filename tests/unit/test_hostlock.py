"""The lock that keeps one demo per root and one launcher per host, root and PORT0 (pool_queue.proc.hostlock)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pool_queue.errors import SetupError
from pool_queue.proc.hostlock import hold

HOLDER = """
import sys
from pathlib import Path
from pool_queue.proc.hostlock import hold
hold(sys.argv[1], Path(sys.argv[2]), *sys.argv[3:])
print("held", flush=True)
sys.stdin.read()
"""


def _holder(*args: str) -> subprocess.Popen[str]:
    """A process that holds the lock until it is killed."""
    p = subprocess.Popen([sys.executable, "-c", HOLDER, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)  # fmt: skip
    assert p.stdout is not None and p.stdout.readline() == "held\n"
    return p


def test_a_held_lock_names_its_holder_and_a_killed_holder_leaves_none_behind(tmp_path, monkeypatch):
    """Refused while another process holds it, naming that process; free again once it is killed (SIGKILL:
    no exit handler runs), with nothing to clean up; another key (PORT0, root) is another lock."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    first = _holder("pool-launch", str(tmp_path / "root"), "PORT0 8001")
    try:
        with pytest.raises(SetupError) as refused:
            hold("pool-launch", tmp_path / "root", "PORT0 8001")
        assert str(refused.value).startswith(
            f"pool-launch is already running on this host for root {tmp_path / 'root'}, PORT0 8001: pid {first.pid} ("
        )
        other = _holder("pool-launch", str(tmp_path / "root"), "PORT0 9001")  # a second node job on the node
        elsewhere = _holder("pool-launch", str(tmp_path / "other"), "PORT0 8001")
        for p in (other, elsewhere):
            p.kill()
            p.wait()
    finally:
        first.kill()
        first.wait()
    assert hold("pool-launch", Path(tmp_path / "root"), "PORT0 8001").parent == tmp_path / "run" / "pool-queue"
