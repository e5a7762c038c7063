"""Nothing outlives the command that started it: SIGTERM and SIGHUP stop `pool-demo` and `pool-launch` as
Ctrl-C does (one line, workers first, then servers and Redis); after a SIGKILL their guard stops what they
started; an earlier launch whose guard died too is named, with its ports, and stopped by the next one. Each
test interrupts one command mid-screen several times on one root, then lets it finish: every step complete,
the reference's verdicts, and the rows written before each stop unchanged."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ports import port0
from redis import Redis
from reference import expected
from test_deploy import launched

from pool_queue.proc.guard import members, start_time
from pool_queue.protocol import Protocol
from pool_queue.store.store import Store

pytestmark = pytest.mark.slow  # demos and launches stopped by signals

P = Protocol()
Groups = list[tuple[int, int]]


def groups_of(pid: int) -> Groups:
    """The process groups that `pid` started, each led by one of its children: (leader, start time)."""
    kids: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():  # a child belongs to the thread that started it
        with contextlib.suppress(OSError):
            kids |= {int(k) for k in (task / "children").read_text().split()}
    return [(k, t) for k in kids if (t := start_time(k)) is not None]


def running(groups: Groups) -> list[str]:
    """The command lines of the live processes of these groups."""
    out = []
    for group, start in groups:
        for pid in members(group, start):
            with contextlib.suppress(OSError):
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
    return out


def left_after(groups: Groups, timeout: float) -> list[str]:
    """What still runs of these groups after a wait of at most `timeout` for all of them to end."""
    deadline = time.monotonic() + timeout
    while (left := running(groups)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def kill(groups: Groups) -> None:
    """The test's own cleanup, whatever it saw."""
    for group, start in groups:
        if members(group, start):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)


def rows(store: Store) -> dict[tuple[int, str], dict]:
    return {(s, r["item_id"]): r for s in P.steps for r in store.read_rows(s, store.winners(s))}


def written(store: Store) -> int:
    """Rows on disk over every step, repeats included: a count of lines, cheap enough to poll while a run
    goes on (the winners' index is not: on a busy machine a run could finish between two looks)."""
    return sum(seg.read_bytes().count(b"\n") for s in P.steps for seg in store.segments(s))


def mid_screen(p: subprocess.Popen[Any], conn: Redis, store: Store, before: int) -> None:
    """Until this run has written rows of its own (more than the `before` lines on disk at its start) and
    holds jobs in flight."""
    deadline = time.monotonic() + 300  # a test timeout only
    while not (written(store) > before and any(conn.zcard(k) for k in conn.scan_iter("rq:wip:pool-*"))):
        assert p.poll() is None and time.monotonic() < deadline, f"the run ended before it was stopped ({before} rows)"
        time.sleep(0.1)


def complete(root: Path, store: Store, kept: dict[tuple[int, str], dict]) -> None:
    """Every step done with the reference's verdicts; every row written before a stop unchanged."""
    for step, items in expected(root).items():
        got = {r["item_id"]: r for r in store.read_rows(step, store.winners(step))}
        assert {k: (r["status"], r["removed"]) for k, r in got.items()} == {k: ("ok", v[0]) for k, v in items.items()}
    now = rows(store)
    assert kept and all(now[k] == r for k, r in kept.items())


class Terminal:
    """A pseudo-terminal that a command runs in as in a user's shell; closing it hangs up (SIGHUP)."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        self.out = b""
        self.closed = threading.Event()

    def start(self, argv: list[str], cwd: Path) -> subprocess.Popen[bytes]:
        """`argv` as a session leader whose controlling terminal this is."""
        tty = self.slave
        p = subprocess.Popen(argv, cwd=cwd, stdin=tty, stdout=tty, stderr=tty, start_new_session=True,
                             preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))  # fmt: skip
        os.close(self.slave)
        threading.Thread(target=self._read, daemon=True).start()  # its output never blocks it
        return p

    def _read(self) -> None:
        while not self.closed.is_set():
            try:
                if select.select([self.master], [], [], 0.1)[0]:
                    self.out += os.read(self.master, 1 << 16)
            except OSError:  # nothing holds the other side now
                time.sleep(0.1)
        os.close(self.master)

    def text(self) -> str:
        return self.out.decode(errors="replace")

    def hang_up(self) -> None:
        self.closed.set()


def test_sigterm_a_closed_terminal_and_sigkill_stop_the_demo_and_all_it_started_and_it_resumes(tmp_path):
    bindir = Path(sys.executable).parent
    argv = [str(bindir / "pool-demo"), "--root", "demo", "--items", "450", "--videos", "90", "--speed", "1"]
    root = tmp_path / "demo"
    store = Store(root / "results" / "pool", P.fingerprint)
    seen: Groups = []
    kept: dict[tuple[int, str], dict] = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGKILL):
            out, err = tmp_path / f"demo-{sig.name}.out", tmp_path / f"demo-{sig.name}.err"
            with out.open("w") as o, err.open("w") as e:
                term = Terminal() if sig == signal.SIGHUP else None  # SIGHUP as an SSH session that drops
                before = written(store)
                p = term.start(argv, tmp_path) if term else subprocess.Popen(argv, cwd=tmp_path, stdout=o, stderr=e)
                with p:
                    mid_screen(p, demo_redis(p, term.text if term else out.read_text), store, before)
                    groups = groups_of(p.pid)
                    seen += groups
                    if term:
                        term.hang_up()
                    else:
                        p.send_signal(sig)
                    p.wait(120)
            said = err.read_text()
            assert not left_after(groups, 60), said[-3000:]
            assert not list((root / "logs" / "demo").glob(".running-*")), "the record of what ran outlived it"
            if sig != signal.SIGKILL:
                assert p.returncode == 128 + sig and "Traceback" not in said, said[-3000:]
            if sig == signal.SIGTERM:
                assert "interrupted" in out.read_text(), said[-3000:]
                order = "worker-2, worker-1, worker-0, sim2b-0, sim8b-1, sim8b-0, redis-[0-9]+"
                assert re.search(rf"^SIGTERM: stopping {order}, in that order$", said, re.M), said[-3000:]
            kept = rows(store)
        again = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert again.returncode == 0 and ": OK," in again.stdout, again.stderr[-3000:]
        assert "left running" not in again.stderr  # the guard stopped what the killed demo had started
        complete(root, store, kept)
    finally:
        kill(seen)


def demo_redis(p: subprocess.Popen[Any], printed: Callable[[], str]) -> Redis:
    """The demo's Redis, from the line the demo prints about it."""
    deadline = time.monotonic() + 300  # a test timeout only
    while not (m := re.search(r"demo Redis: (redis://\S+)", printed())):
        assert p.poll() is None and time.monotonic() < deadline, printed()[-3000:]
        time.sleep(0.1)
    return Redis.from_url(m[1])


def test_sighup_sigterm_and_sigkill_stop_a_launch_and_all_it_started_and_a_rerun_resumes(pool_root, redis_url):
    base = port0()
    env = {**os.environ, "POOL_ROOT": str(pool_root), "REDIS_URL": redis_url, "NGPU": "1", "PORT0": str(base),
           "MAX_SEQS": "8"}  # fmt: skip
    argv = [sys.executable, "-m", "pool_queue.commands.launch", "--sim", "--burst", "--sim-speed", "0.5"]
    conn = Redis.from_url(redis_url)
    store = Store(pool_root / "results" / "pool", P.fingerprint)
    seen: Groups = []
    kept: dict[tuple[int, str], dict] = {}
    try:
        # the last SIGKILL takes the launch's guard with it: what they started is left for the next launch
        for sig, guard_too in ((signal.SIGHUP, False), (signal.SIGTERM, False), (signal.SIGKILL, False),
                               (signal.SIGKILL, True)):  # fmt: skip
            before = written(store)
            with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
                mid_screen(p, conn, store, before)
                groups = groups_of(p.pid)
                seen += groups
                if guard_too:
                    (guard,) = [g for g in groups if any("-m pool_queue.proc.guard" in c for c in running([g]))]
                    os.kill(guard[0], signal.SIGKILL)
                p.send_signal(sig)
                _, said = p.communicate(timeout=120)
            kept = rows(store)
            if guard_too:
                assert running(groups), "nothing left behind to test the next launch with"
                break
            assert not left_after(groups, 60), said[-3000:]
            if sig != signal.SIGKILL:
                assert p.returncode == 0 and "Traceback" not in said, said[-3000:]
                order = r"client_s[0-9-]+_gpu0, vllm_s[0-9-]+_gpu0"
                assert re.search(rf"^{sig.name}: stopping {order}, in that order$", said, re.M), said[-3000:]
        again = launched(argv, env, pool_root)
        assert again.returncode == 0, again.stderr[-3000:]
        named = [line for line in again.stderr.splitlines() if "left running" in line]
        host = re.escape(socket.gethostname())
        assert len(named) == 1 and re.fullmatch(
            rf"`launch.py` \(pid \d+, gone\) left running on {host}: "
            rf"vllm_s[0-9-]+_gpu0 \(pid \d+, port {base}\)(, client_s[0-9-]+_gpu0 \(pid \d+, port {base + 100}\))?; "
            r"stopping them", named[0]), named  # fmt: skip
        assert not running(groups) and all(f"STEP={n} REMAINING_TOTAL=0" in again.stdout for n in (1, 2, 3))
        complete(pool_root, store, kept)
    finally:
        kill(seen)


def test_sigterm_to_a_test_run_stops_what_its_fixtures_started(tmp_path):
    """The harness (tests/conftest.py) as a test run uses it: SIGTERM to pytest mid-test tears the fixtures
    down as Ctrl-C does, with the one line, and leaves nothing running (the session's Redis too)."""
    tests = Path(__file__).resolve().parents[1]
    (tmp_path / "test_holds.py").write_text(
        "import time\nfrom pool_queue.proc.procs import free_port\n\n\ndef test_holds(procs, redis_url, tmp_path):\n"
        "    procs.redis(free_port(), tmp_path / 'redis')\n    procs.sim('sim-a', free_port())\n"
        "    print('READY', flush=True)\n    time.sleep(600)\n"
    )
    path = os.pathsep.join(map(str, (tests, tests / "harness", tests.parent)))
    argv = [sys.executable, "-m", "pytest", "-s", "-q", "-p", "conftest", "-p", "no:cacheprovider", "test_holds.py"]
    with subprocess.Popen(argv, cwd=tmp_path, env={**os.environ, "PYTHONPATH": path}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as p:  # fmt: skip
        assert p.stdout is not None
        said = ""
        while "READY" not in said:
            line = p.stdout.readline()
            assert line, said
            said += line
        groups = groups_of(p.pid)
        try:
            p.send_signal(signal.SIGTERM)
            said += p.communicate(timeout=60)[0]
            assert not left_after(groups, 30), said
        finally:
            kill(groups)
    assert re.search(r"^SIGTERM: stopping sim-a, redis-[0-9]+, in that order$", said, re.M), said
