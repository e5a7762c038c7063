"""Settings and arguments a user gets wrong, through the real commands: a value out of range is refused by the
parser before anything is made; a value that came from a `.env` is named with that file when it fails; the
Redis of a stopped demo is judged gone at once; a results folder that cannot be used is named with its
setting and the cause in words; a JSONL line cut in the middle says so. One line and exit 2 each.

No assertion reads the clock: a wait that did not happen is seen as the absence of its line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pool_queue.proc.procs import free_port
from pool_queue.protocol import Protocol
from pool_queue.settings import DEMO_ENV_MARK
from pool_queue.store.store import Store

pytestmark = pytest.mark.slow  # the real commands, one or more per test

BIN = Path(sys.executable).parent
ROOT_FLAGS = ("--root", "pool")  # a root that does not exist: nothing may make it


def run(
    *argv: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """A command as a user in `cwd` runs it: the `.env` there is read (the suite turns it off elsewhere)."""
    clean = {
        k: v for k, v in os.environ.items() if k not in ("POOL_ENV_FILE", "REDIS_URL", "POOL_ROOT", "POOL_RESULTS")
    }
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**clean, **(env or {})})  # fmt: skip


def one_line(out: subprocess.CompletedProcess[str]) -> str:
    """Exit 2, no traceback, one line on stderr."""
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


def tree(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


OUT_OF_RANGE = [
    ("pool-demo", "--items", "0"),
    ("pool-demo", "--videos", "0"),
    ("pool-demo", "--speed", "0"),
    ("pool-demo", "--speed", "-3"),
    ("pool-demo", "--progress-every", "-1"),
    ("pool-synth", "pool", "--items", "0"),
    ("pool-synth", "pool", "--videos", "-1"),
    ("pool-synth", "pool", "--min-frames", "0"),
    ("pool-synth", "pool", "--corrupt-frames", "-1"),
    ("pool-enqueue", *ROOT_FLAGS, "--step", "1", "--chunk-size", "0"),
    ("pool-enqueue", *ROOT_FLAGS, "--step", "1", "--limit", "-5"),
    ("pool-worker", *ROOT_FLAGS, "--server", "http://127.0.0.1:9", "--inflight", "0"),
    ("pool-worker", *ROOT_FLAGS, "--server", "http://127.0.0.1:9", "--wait-redis", "-1"),
    ("pool-worker", *ROOT_FLAGS, "--server", "http://127.0.0.1:9", "--metrics-port", "70000"),
    ("pool-launch", *ROOT_FLAGS, "--sim", "--sim-speed", "0"),
    ("pool-launch", *ROOT_FLAGS, "--sim", "--health-timeout", "-1"),
    ("pool-status", *ROOT_FLAGS, "--watch", "0"),
    ("pool-items", *ROOT_FLAGS, "--show", "-1"),
    ("pool-sim", "--speed", "0"),
    ("pool-sim", "--max-num-seqs", "0"),
    ("pool-sim", "--port", "-1"),
]


@pytest.mark.parametrize("argv", OUT_OF_RANGE, ids=" ".join)
def test_a_value_out_of_range_is_one_line_naming_its_flag_and_nothing_is_made(tmp_path, argv):
    """In a folder where a demo left its `.env`: the flag is refused before any root, `.env` or log exists."""
    (tmp_path / ".env").write_text(f"{DEMO_ENV_MARK}POOL_ROOT={tmp_path / 'other'}\nREDIS_URL=redis://127.0.0.1:9/0\n")
    before = tree(tmp_path)
    line = one_line(run(*argv, cwd=tmp_path))
    flag, value = argv[-2:]
    assert line.startswith(f"error: {argv[0]}: argument {flag}: {value}: must be "), line
    assert tree(tmp_path) == before  # no root, no .env rewritten, no log


def test_a_value_that_is_not_a_number_is_one_line(tmp_path):
    line = one_line(run("pool-demo", "--items", "1.5", cwd=tmp_path))
    assert (
        line == "error: pool-demo: argument --items: '1.5' is not a whole number (pool-demo --help lists the options)"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_bad_setting_in_the_env_file_is_named_with_that_file(tmp_path):
    (tmp_path / ".env").write_text("POOL_CHUNK_SIZE=0\n")
    line = one_line(run("pool-enqueue", *ROOT_FLAGS, "--step", "1", "--plan-only", cwd=tmp_path))
    assert line.startswith(f"error: setting POOL_CHUNK_SIZE from {tmp_path / '.env'}: "), line


def test_an_env_file_line_that_is_not_name_value_is_one_line_naming_the_file_and_line(tmp_path):
    """Named by its number only: any word of it may be a secret. Names python-dotenv takes (`my.key`, `MY-KEY`)
    are not settings, and not refused."""
    env = tmp_path / ".env"
    env.write_text("# mine\nREDIS_URL=redis://127.0.0.1:9/0\nREDIS_PASSWORD hunter2\n")
    line = one_line(run("pool-status", cwd=tmp_path))
    assert line == f"error: {env}, line 3 is not NAME=VALUE: fix or delete that line"
    env.write_text("my.key=1\nMY-KEY=2\nREDIS_URL=redis://127.0.0.1:9/0\n")
    assert "NAME=VALUE" not in run("pool-status", cwd=tmp_path).stderr
    env.write_text("POOL_ROOT=pool\n'hunter2\n")
    line = one_line(run("pool-status", cwd=tmp_path))
    assert line == f"error: {env}, line 2 is not NAME=VALUE: fix or delete that line"


def test_a_misspelt_pool_variable_is_named_once_with_the_setting_it_resembles(pool_root, tmp_path):
    """In the `.env` file or the environment; the command goes on (the variable may be the user's own), and
    the folder it reads from names where its root came from."""
    (tmp_path / ".env").write_text(f"POOL_RUUT={pool_root}\nPOOL_MAX_SEQS=8\nPOOL_DIR=/x\n")
    out = run("pool-items", cwd=tmp_path, env={"POOL_CHUNK_SIZ": "64"})
    env = tmp_path / ".env"
    assert out.stderr.splitlines() == [
        "warning: POOL_CHUNK_SIZ in the environment is read by no pool-* command (did you mean POOL_CHUNK_SIZE?)",
        f"warning: POOL_RUUT in {env} is read by no pool-* command (did you mean POOL_ROOT?)",
        "error: items folder pool/items does not exist (root: the default, ./pool, as this folder holds no items/: "
        "run from the package root, or give --root)",
    ], out.stderr
    (tmp_path / ".env").write_text(f"POOL_ROOT={tmp_path / 'gone'}\n")
    line = one_line(run("pool-items", cwd=tmp_path))
    assert line == f"error: items folder {tmp_path / 'gone' / 'items'} does not exist (root: POOL_ROOT from {env})"
    (tmp_path / ".env").write_bytes(f"\ufeffPOOL_ROOT={pool_root}\n".encode())  # an editor's byte-order mark
    assert run("pool-items", cwd=tmp_path).stderr == ""  # every name known: not a word


@contextmanager
def demo_running(root: Path) -> Iterator[None]:
    """pool-demo's lock on `root` held by a live process, as a running demo holds it."""
    hold = (
        f"from pathlib import Path; from pool_queue.proc.hostlock import hold; hold('pool-demo', Path({str(root)!r})); "
    )
    p = subprocess.Popen([sys.executable, "-c", hold + "print('held', flush=True); input()"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert p.stdout is not None and p.stdout.readline() == "held\n"
        yield
    finally:
        p.kill()
        p.wait()


def test_the_redis_of_a_stopped_demo_is_named_with_its_env_file_and_not_waited_for(pool_root, tmp_path):
    """A `.env` that pool-demo wrote, its demo gone: every command that needs its Redis says at once where the
    URL came from and what to do, without the 30 s wait for a Redis that went with the demo. While the demo
    runs, the same URL is waited for as an outage, the wait naming the file."""
    gone = f"redis://127.0.0.1:{free_port()}/0"
    env_file = tmp_path / ".env"
    env_file.write_text(f"{DEMO_ENV_MARK}POOL_ROOT={pool_root}\nREDIS_URL={gone}\n")
    said = f"Redis at {gone} (REDIS_URL from {env_file}, written by pool-demo for a demo that is not running)"
    for argv in (("pool-launch", "--sim", "--burst"), ("pool-worker", "--burst", "--server", "http://127.0.0.1:9")):
        line = one_line(run(*argv, cwd=tmp_path, env={"PORT0": str(free_port())}))
        assert line.startswith(f"error: {said} unreachable") and f"delete {env_file}" in line, (argv, line)
    for argv in (("rq", "info", "-c", "pool_queue.rq_config"), ("pool-enqueue", "--step", "1")):
        line = one_line(run(*argv, cwd=tmp_path))
        assert line.startswith(f"error: {said} unreachable"), (argv, line)
    assert "set REDIS_URL to a running Redis" in line  # what rq info, which has no --redis-url, can do too
    assert not (pool_root / "results" / "pool" / "PROTOCOL.json").exists()  # nothing stamped
    with demo_running(pool_root):
        out = run(
            "pool-launch", "--sim", "--burst", cwd=tmp_path, env={"POOL_WAIT_REDIS_S": "0", "PORT0": str(free_port())}
        )
    first, *_, last = out.stderr.strip().splitlines()
    running = f"Redis at {gone} (REDIS_URL from {env_file}, written by pool-demo for a demo that runs) unreachable"
    assert first.startswith(running) and "waiting up to 0 s" in first, out.stderr
    assert out.returncode == 2 and last.startswith(f"error: {running}") and "gave up after 0 s" in last, out.stderr
    P = Protocol()
    Store(pool_root / "results" / "pool", P.fingerprint, P.model_dump(mode="json")).claim()  # a screen begun
    plan = run("pool-enqueue", "--step", "1", "--plan-only", cwd=tmp_path, env={"COLUMNS": "1000"})  # no wrapping
    assert plan.returncode == 0 and f"{said} unreachable (" in plan.stderr, plan.stderr  # the plan goes on


def test_a_redis_url_from_an_env_file_is_named_with_it_in_the_wait(pool_root, tmp_path):
    """Any `.env` (not a demo's): the wait's first line and its end name the file the URL came from."""
    gone = f"redis://127.0.0.1:{free_port()}/0"
    (tmp_path / ".env").write_text(f"POOL_ROOT={pool_root}\nREDIS_URL={gone}\n")
    out = run(
        "pool-launch", "--sim", "--burst", cwd=tmp_path, env={"POOL_WAIT_REDIS_S": "0", "PORT0": str(free_port())}
    )
    lines = out.stderr.strip().splitlines()
    said = f"Redis at {gone} (REDIS_URL from {tmp_path / '.env'}) unreachable"
    assert out.returncode == 2 and lines[0].startswith(said) and lines[-1].startswith(f"error: {said}"), out.stderr


def test_a_results_folder_that_cannot_be_used_is_named_with_its_setting_and_why(pool_root, tmp_path, redis_url):
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    plan = ("pool-enqueue", "--root", str(pool_root), "--step", "1", "--redis-url", redis_url)
    line = one_line(run(*plan, "--results", str(a_file), cwd=tmp_path))
    assert line.startswith(f"error: results folder {a_file} (--results) is a file, not a folder: "), line
    line = one_line(run(*plan, "--results", str(a_file / "below"), cwd=tmp_path))
    assert f"results folder {a_file / 'below'} (--results) cannot be made: {a_file} is a file, not a folder" in line
    (tmp_path / ".env").write_text(f"POOL_ROOT={pool_root}\nPOOL_RESULTS={a_file}\n")
    line = one_line(run(plan[0], *plan[3:], cwd=tmp_path))
    assert f"results folder {a_file} (POOL_RESULTS from {tmp_path / '.env'}) is a file, not a folder" in line, line
    for cmd in ("pool-status", "pool-report", "pool-audit"):  # the commands that only read: not an empty screen
        line = one_line(run(cmd, "--root", str(pool_root), "--results", str(a_file), cwd=tmp_path))
        assert f"results folder {a_file} (--results) is a file, not a folder" in line, (cmd, line)
    assert a_file.read_text() == "x" and not (tmp_path / "report").exists()


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed (.ci/run installs it)")
def test_a_results_folder_on_a_read_only_disk_says_so(pool_root, tmp_path, redis_url):
    """A read-only file system, without root: strace has the kernel refuse the folder's mkdir with EROFS."""
    results = tmp_path / "results"
    argv = [str(BIN / "pool-enqueue"), "--root", str(pool_root), "--results", str(results), "--step", "1",
            "--redis-url", redis_url]  # fmt: skip
    strace = ["strace", "-f", "-qq", "-o", os.devnull, "-P", str(results), "-e", "trace=mkdir,mkdirat",
              "-e", "inject=mkdir,mkdirat:error=EROFS"]  # fmt: skip
    out = subprocess.run([*strace, *argv], capture_output=True, text=True, timeout=120)
    line = one_line(out)
    assert line.startswith(f"error: results folder {results} (--results) is on a read-only file system: "), line


def test_a_damaged_stamp_is_one_line_naming_it(pool_root, tmp_path):
    stamp = pool_root / "results" / "pool" / "PROTOCOL.json"
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text('{"fingerprint": "v1-')
    line = one_line(run("pool-status", "--root", str(pool_root), "--no-health", cwd=tmp_path))
    assert line.startswith(f"error: {stamp} is not valid JSON"), line


def test_a_jsonl_line_cut_in_the_middle_is_named_with_its_file_and_line(pool_root, tmp_path):
    late = pool_root / "items" / "late.jsonl"
    late.write_text('{"item_id": "whole", "benchmark": "b", "video_id": "v", "question": "q?", "options": ["a", "b"], '
                    '"answer": 0}\n{"item_id": "cut", "benchmark": "b", "question": "What is\n')  # fmt: skip
    out = run("pool-items", "--root", str(pool_root), "--report", str(tmp_path / "rejected.csv"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = (tmp_path / "rejected.csv").read_text().splitlines()
    assert f'"cut","{late.name}",2,"line cut in the middle: it ends inside its item' in "\n".join(rows), rows


def test_pool_demo_on_a_root_that_does_not_load_starts_nothing_and_leaves_the_env_file(tmp_path):
    """The `.env` of the folder (an older demo's) is rewritten only once the new root is whole: a root whose
    items do not load is one line, and nothing was started, stamped or rewritten."""
    root = tmp_path / "broken"
    (root / "items").mkdir(parents=True)
    (root / "items" / "x.jsonl").write_text('{"question": "q?"}\n')
    env = f"{DEMO_ENV_MARK}POOL_ROOT={tmp_path / 'older'}\nREDIS_URL=redis://127.0.0.1:9/0\n"
    (tmp_path / ".env").write_text(env)
    line = one_line(run("pool-demo", "--root", "broken", cwd=tmp_path))
    assert "missing column" in line and "x.jsonl" in line, line
    assert (tmp_path / ".env").read_text() == env and sorted(os.listdir(root)) == ["items"]


def test_a_root_that_cannot_be_made_is_named_with_the_cause(tmp_path):
    """pool-synth and pool-demo: a file where a folder of the new root should be is said in words."""
    (tmp_path / "afile").write_text("x")
    for argv in (("pool-synth", "afile/new", "--items", "10", "--videos", "3"), ("pool-demo", "--root", "afile/new")):
        line = one_line(run(*argv, cwd=tmp_path))
        assert line == "error: root afile/new cannot be made: afile is a file, not a folder: choose another root", line
    assert sorted(os.listdir(tmp_path)) == ["afile"]


def test_a_cut_frames_manifest_is_one_line_and_a_damaged_extraction_record_unpacks_again(pool_root, tmp_path):
    manifest = pool_root / "frames_tar" / "frames_manifest.json"
    whole = manifest.read_text()
    manifest.write_text(whole[: len(whole) // 2])
    line = one_line(run("pool-frames", "--root", str(pool_root), "--verify-only", cwd=tmp_path))
    assert line.startswith(f"error: {manifest}: not valid JSON (") and "pool-fetch --frames" in line, line
    manifest.write_text(whole)
    record = pool_root / "frames" / ".pool_frames.extracted.json"
    record.write_text('["0123')  # a crash mid-write of the record: the shards are unpacked again
    out = run("pool-frames", "--root", str(pool_root), cwd=tmp_path)
    assert out.returncode == 0 and "extracted" in out.stdout, out.stderr[-2000:]
