"""Shared fixtures: a synthetic package root and a real redis-server (each made once per session)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis
from stack import Stack, make_screen

from pool_queue.demo.synth import SynthConfig, generate
from pool_queue.jobs.queue import Screen
from pool_queue.proc.procs import Procs, free_port, interrupt_on_stop_signals

# A `.env` that `make demo` left in the checkout must not steer the tests (nor the commands they run).
os.environ["POOL_ENV_FILE"] = ""
# SIGTERM and SIGHUP end a test run as Ctrl-C does: the fixtures' teardown stops every process they started.
interrupt_on_stop_signals()
STOPPED_BY: list[str] = []  # the stop signal that ended this run, if one did
# pool-launch's vLLM cache (compile cache, flags probe) goes to a folder of the run's, never the user's home.
os.environ.setdefault("VLLM_CACHE_ROOT", tempfile.mkdtemp(prefix="pool-vllm-cache-"))


@pytest.fixture(scope="session")
def small_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small pool (read-only by convention: copy it before writing results)."""
    root = tmp_path_factory.mktemp("pool") / "root"
    generate(root, SynthConfig(n_items=240, n_videos=60, seed=3, frames=(8, 40), shard_videos=25))
    return root


@pytest.fixture()
def pool_root(small_root: Path, tmp_path: Path) -> Iterator[Path]:
    """A private copy of the small pool whose results/ and logs/ a test may write."""
    root = tmp_path / "root"
    shutil.copytree(small_root, root, symlinks=True)
    yield root


def pytest_configure(config: pytest.Config) -> None:
    """`--dist loadgroup` keeps the Docker tests on one worker and the Slurm test on one (their xdist_group)
    only where pytest-xdist can add the group to a test's id; pytest 9.2 stops it (xdist 3.8), and the
    groups would then be spread over the workers, sharing one engine and one cluster at once."""
    if hasattr(config, "workerinput") or config.getoption("dist", "no") != "loadgroup":
        return
    import xdist

    def version(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())

    if version(pytest.__version__) >= (9, 2) and version(xdist.__version__) <= (3, 8):
        raise pytest.UsageError(
            f"--dist loadgroup does not group tests on pytest {pytest.__version__} with pytest-xdist "
            f"{xdist.__version__}: install the dev extra's pytest (pip install -e '.[dev]'), or run without "
            "xdist (make ... XDIST=)"
        )


def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    """Called before the teardown that a stop signal (Ctrl-C, SIGTERM, SIGHUP) leads to."""
    STOPPED_BY.append(str(excinfo.value) or "Ctrl-C")


@pytest.fixture()
def procs(tmp_path: Path) -> Iterator[Procs]:
    """The shared harness: every process a test starts (Redis, simulators, workers) is stopped when it
    ends, last started first; their logs are in tmp_path/logs. A stop signal says what it stops."""
    with Procs(tmp_path / "logs") as p:
        yield p
        if STOPPED_BY:
            p.say_stopping(STOPPED_BY[0])


@pytest.fixture()
def stack(pool_root: Path, procs: Procs) -> Stack:
    """A real stack over a private copy of the small pool; Redis keeps an append-only file, so a test
    can kill and restart it."""
    return Stack(pool_root, procs, aof=True)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real redis-server for the session (one per xdist worker): starting one per test cost more than
    many of the tests that use it. Stopped at the end of the run, or by a stop signal, saying so."""
    with Procs(tmp_path_factory.mktemp("session-redis") / "logs") as p:
        yield p.redis(free_port(), p.log_dir.parent / "redis")
        if STOPPED_BY:
            p.say_stopping(STOPPED_BY[0])


@pytest.fixture()
def redis_url(redis_server: str) -> str:
    """The session's redis-server, emptied for this test and with its memory limit off (a test may set
    one). A test that kills, restarts or protects its Redis starts its own (`procs.redis`, `stack`)."""
    conn = Redis.from_url(redis_server)
    conn.flushall()
    conn.config_set("maxmemory", 0)
    conn.config_set("maxmemory-policy", "noeviction")
    conn.close()
    return redis_server


@pytest.fixture()
def screen(tmp_path: Path, redis_url: str) -> Screen:
    return make_screen(tmp_path / "results", redis_url)
