"""A results disk that turns read-only in the middle of a batch's write (ext4's errors=remount-ro, an NFS
export gone read-only): the first piece of the batch lands, then the disk refuses the rest and the
cut-back too. Made without root from real parts: a file-size limit (RLIMIT_FSIZE) cuts the write after
its first piece with EFBIG, and strace has the kernel refuse the worker's first ftruncate with EROFS (the
cut-back), held a few seconds so that the test can make the disk refuse everything before the worker
probes it. strace counts calls per thread, so each worker thread's first ftruncate is refused and held
too: a cut-back retried in a thread new to it is refused again, and the waits allow for each refusal.
Once writes work again, the worker cuts its partial line before it takes work: no torn line, a clean
audit, a packed root, and every step equal to the queue-free reference.

A disk read-only from before a step's folder exists (a read-only bind mount, which root's writes cannot pass
either): the worker holds, its launcher says so on the console, and once the disk is writable the hold's
probe makes the folder the write needs, so the hold ends, the launcher says that too, and the queue drains."""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest
from ports import port0
from stack import FAST, Stack, cli, expected, running

pytestmark = pytest.mark.slow  # a stack: Redis, simulators, workers

BIN = Path(sys.executable).parent
CUT_DELAY_US = 15_000_000  # the refused cut-back is held this long: time to see the torn tail and shut the disk


def wait_for(
    what: Callable[[], bool], timeout: float | Callable[[], float], why: Callable[[], str] = lambda: ""
) -> None:
    """Wait until `what`; a callable `timeout` is asked again at each look (a bound that grows as faults are seen)."""
    start = time.monotonic()
    while not what():
        assert time.monotonic() < start + (timeout() if callable(timeout) else timeout), why()
        time.sleep(0.05)


def segments_of(stack: Stack, prefix: str, step: int = 1) -> list[Path]:
    return [s for s in stack.store.segments(step) if s.name.startswith(f"seg-{prefix}.")]


def rows_in(segs: list[Path]) -> int:
    return sum(s.read_bytes().count(b"\n") for s in segs)


def jobs_of(stack: Stack, prefix: str) -> int:
    return sum(1 for j in running(stack).values() if (j.worker_name or "").startswith(prefix + "."))


def writer_pid(seg: Path) -> int:
    """The pid of the process that writes a segment (in its name: seg-<worker>-<host>-<pid>-<stamp>.jsonl)."""
    m = re.search(rf"-{re.escape(socket.gethostname())}-(\d+)-", seg.name)
    assert m, seg
    return int(m.group(1))


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (apt-get install strace)")
def test_a_disk_gone_read_only_mid_write_leaves_no_torn_line_once_writes_work_again(stack, tmp_path):
    a = stack.sim("simA", "qwen3-vl-8b", "--max-num-seqs", "4", "--speed", "0.5")
    stack.enqueue(1, chunk_size=8)
    trace = tmp_path / "ftruncate.trace"
    argv = ["strace", "-f", "--seccomp-bpf", "-qq", "-e", "signal=none", "-o", str(trace), "-e", "trace=ftruncate",
            "-e", f"inject=ftruncate:error=EROFS:delay_exit={CUT_DELAY_US}:when=1",
            sys.executable, "-m", "workers.main", "--server", a, "--name", "wdisk", "--steps", "1"]  # fmt: skip
    proc, log = stack.piped_worker("wdisk", argv, FAST)
    refused = lambda: [int(n) for n in re.findall(r"ftruncate\(\d+, (\d+)\).*INJECTED", trace.read_text())]  # noqa: E731

    def past_refusals(base: float) -> Callable[[], float]:
        """`base` seconds plus the hold of each refused ftruncate so far and of one in flight (strace writes a
        refused call's line once its hold ends); at most one refusal per worker thread, so the bound is finite."""
        return lambda: base + (len(refused()) + 1) * CUT_DELAY_US / 1e6

    wait_for(lambda: rows_in(segments_of(stack, "wdisk")) >= 16 and jobs_of(stack, "wdisk") > 0, 180, log)

    worker = writer_pid(segments_of(stack, "wdisk")[0])  # strace's child
    os.kill(worker, signal.SIGSTOP)  # between two writes: the segment holds whole, acknowledged batches
    wait_for(lambda: Path(f"/proc/{worker}/stat").read_text().split(") ")[1][0] in "tT", 10)
    [seg] = segments_of(stack, "wdisk")
    kept = seg.read_bytes()
    assert kept.endswith(b"\n")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.prlimit(worker, resource.RLIMIT_FSIZE, (len(kept) + 200, hard))  # the next batch lands 200 bytes
    os.kill(worker, signal.SIGCONT)
    b = stack.sim("simB", "qwen3-vl-8b", "--speed", "2")
    s2 = stack.sim("sim2", "qwen3-vl-2b", "--speed", "10")
    stack.worker("wb", b, env=FAST)  # steps 1 and 2, and step 3 beside: the screen goes on without wdisk
    stack.worker("w2", s2, env=FAST)

    wait_for(lambda: seg.stat().st_size == len(kept) + 200, 120, log)  # the first piece, while the cut is held
    resource.prlimit(worker, resource.RLIMIT_FSIZE, (1, hard))  # now the disk refuses every write
    wait_for(lambda: "cannot write rows to" in log(), 2 * CUT_DELAY_US / 1e6, log)
    wait_for(lambda: jobs_of(stack, "wdisk") == 0, 10, log)
    time.sleep(3 * float(FAST["POOL_LEASE_S"]))  # held: it probes, writes nothing, takes nothing
    torn = seg.read_bytes()
    assert torn.startswith(kept) and len(torn) == len(kept) + 200 and not torn.endswith(b"\n")
    assert all(b"\n" not in s.read_bytes() for s in segments_of(stack, "wdisk") if s != seg)  # no row lands
    assert proc.poll() is None

    resource.prlimit(worker, resource.RLIMIT_FSIZE, (soft, hard))  # writes work again
    wait_for(lambda: "taking work again" in log(), past_refusals(60), log)
    want = expected(stack.root)
    done = lambda: all(len(stack.winners(step)) == len(want[step]) for step in (1, 2, 3))  # noqa: E731
    wait_for(done, 300, lambda: log() + stack.log("wb"))
    # a batch whose job was handed back when the disk went may still fail after the hold cleared (its refused
    # cut-back held by strace): its error reaches no job, and the worker holds again until that line is cut
    whole = lambda: all(s.read_bytes().endswith(b"\n") for s in segments_of(stack, "wdisk") if s.stat().st_size)  # noqa: E731
    wait_for(whole, past_refusals(30), log)

    text = log()
    assert seg.read_bytes() == kept, "the partial line is cut, and nothing acknowledged before it is touched"
    cut = text.index(f"cut a failed write's partial line (200 bytes at offset {len(kept)})")
    assert cut < text.index("taking work again"), text  # cut before it took work
    assert "File too large" in text and "could not be cut back (Read-only file system)" in text, text
    assert "Traceback" not in text, text
    cuts = refused()  # the piece's cut-back first; then its retries and fresh segments' cut-backs in new threads
    assert cuts[0] == len(kept) and set(cuts) <= {len(kept), 0}, cuts
    for step in (1, 2, 3):
        got = stack.winners(step)
        assert {k: (r["status"], r["removed"]) for k, r in got.items()} == {
            k: ("ok", v[0]) for k, v in want[step].items()
        }
        for segment in stack.store.segments(step):
            data = segment.read_bytes()
            assert not data or data.endswith(b"\n"), segment
            for line in data.splitlines():
                orjson.loads(line)
    audit = cli(stack, str(BIN / "pool-audit"), "--complete")
    assert audit.returncode == 0, audit.stdout + audit.stderr
    pack = cli(stack, str(BIN / "pool-pack"), "--out", str(tmp_path / "packed"))
    assert pack.returncode == 0 and list((tmp_path / "packed").glob("*.tar.gz")), pack.stdout + pack.stderr


def test_a_partial_line_no_job_saw_is_cut_before_the_worker_takes_work(stack, monkeypatch):
    """A write refused after its job was handed back (the task cancelled while its thread wrote) raises to no
    job, yet its partial line is in the store's torn list: the worker cuts it before it claims any job, as
    after a refused write it saw itself. The worker runs in this process, its store given such a line."""
    import asyncio
    import errno

    from pool_queue.jobs import lease as leases
    from workers import main as worker_main

    url = stack.sim("sim8", "qwen3-vl-8b", "--zero-latency")
    stack.enqueue(1, chunk_size=60)
    made: list[Path] = []
    seen: list[bytes] = []  # the segment as each claim found it
    real_worker, real_claim = worker_main._worker, leases.claim

    def worker_with_a_partial_line(*args):  # type: ignore[no-untyped-def]
        w = real_worker(*args)
        seg = w.store.step_dir(1) / f"seg-{w.config.name}-refused.jsonl"
        seg.parent.mkdir(parents=True, exist_ok=True)
        seg.write_bytes(b'{"item_id": "cut-here')
        w.store.torn.add(seg, 0, OSError(errno.EROFS, "Read-only file system"))
        made.append(seg)
        return w

    def claim(*args, **kw):  # type: ignore[no-untyped-def]
        seen.append(made[0].read_bytes())
        return real_claim(*args, **kw)

    monkeypatch.setattr(worker_main, "_worker", worker_with_a_partial_line)
    monkeypatch.setattr(leases, "claim", claim)
    for k, v in stack.env.items():
        monkeypatch.setenv(k, v)
    assert asyncio.run(worker_main._main(["--server", url, "--name", "w", "--steps", "1", "--burst"])) == 0
    assert seen and set(seen) == {b""}, seen[:3]
    assert len(stack.winners(1)) == 240


@contextmanager
def read_only(folder: Path) -> Iterator[Callable[[], None]]:
    """`folder` read-only for every process, root's included (a read-only bind mount of it onto itself); the
    callable makes it writable again (as at the end)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a read-only bind mount needs root and mount(8)")
    mounted = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"no bind mount here: {mounted.stderr.strip()}")
    state = {"on": True}

    def writable() -> None:
        if state["on"]:
            subprocess.run(["umount", str(folder)], check=True)
            state["on"] = False

    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder), str(folder)], check=True)
        yield writable
    finally:
        writable()


def test_a_disk_read_only_before_a_step_folder_exists_holds_is_said_at_the_console_and_clears(stack, tmp_path):
    """The step's folder cannot be made while the disk refuses writes; the hold's probe makes it once the disk
    is back (a probe that only wrote into the folder would fail for ever). pool-launch says when the hold
    begins and when it ends, in that order, and returns once the queue is empty."""
    stack.enqueue(1, chunk_size=30)  # stamps the results root: only the step folders are left to make
    results = stack.store.root
    assert not stack.store.step_dir(1).exists()
    env = {**os.environ, **stack.env, **FAST, "NGPU": "1", "PORT0": str(port0())}
    argv = [sys.executable, "-m", "pool_queue.commands.launch", "--step", "1", "--sim", "--burst"]
    console = tmp_path / "launch.err"
    begins = f": cannot write rows to {results / 'step1'}: Read-only file system: its jobs go back to the queue"
    ends = f": rows can be written to {results / 'step1'} again after "
    with (
        read_only(results) as writable,
        console.open("w+") as err,
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err, text=True) as launch,
    ):
        try:
            wait_for(lambda: begins in console.read_text(), 180, console.read_text)
            assert launch.poll() is None and not stack.store.step_dir(1).exists(), console.read_text()
            writable()
            out, _ = launch.communicate(timeout=300)
        finally:
            if launch.poll() is None:
                launch.kill()
    text = console.read_text()
    assert launch.returncode == 0 and "Traceback" not in text and "\nREMAINING_TOTAL=0" in out, text[-3000:]
    lines = text.splitlines()
    began = [i for i, line in enumerate(lines) if begins in line]
    ended = [i for i, line in enumerate(lines) if ends in line and line.endswith("s: taking work again")]
    assert began and ended and began[0] < ended[0], text[-3000:]
    assert {lines[i].split(": ")[0] for i in began} == {lines[i].split(": ")[0] for i in ended}, text[-3000:]
    want = expected(stack.root)[1]
    assert {k: (r["status"], r["removed"]) for k, r in stack.winners(1).items()} == {
        k: ("ok", v[0]) for k, v in want.items()
    }
    assert not list(stack.store.step_dir(1).glob(".probe-*")), "a probe leaves no file behind"
