"""A real stack for end-to-end tests: redis-server, simulated vLLM servers, worker processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from redis import Redis
from reference import expected  # noqa: F401  (the tests' reference)
from rq.job import Job
from rq.serializers import JSONSerializer

from pool_queue.inputs.items import load_items
from pool_queue.jobs.produce import Produced, produce, rescue_abandoned
from pool_queue.jobs.queue import Screen, screen_of
from pool_queue.proc.procs import Procs, free_port, wait_health
from pool_queue.protocol import Protocol
from pool_queue.store.store import Store

P = Protocol()


# Recovery settings compressed so that leases expire, heartbeats renew them and rescues run within seconds.
FAST = {"POOL_LEASE_S": "3", "POOL_HEARTBEAT_S": "0.5", "POOL_RESCUE_S": "1"}


def make_screen(root: Path, url: str) -> Screen:
    """The screen of a freshly stamped results root, on the Redis at `url`."""
    store = Store(root, P.fingerprint, P.model_dump(mode="json"))
    store.claim()
    screen = screen_of(store, Redis.from_url(url))
    assert screen is not None
    return screen


class Stack:
    def __init__(self, root: Path, procs: Procs, aof: bool = False) -> None:
        self.root = root
        self.procs = procs
        self.aof = aof
        self.redis_port = free_port()
        self.redis_url = self.start_redis()
        self.conn = Redis.from_url(self.redis_url)
        self.store = Store(root / "results" / "pool", P.fingerprint)
        self.env = {"POOL_ROOT": str(root), "REDIS_URL": self.redis_url, "PYTHONUNBUFFERED": "1"}

    def start_redis(self) -> str:
        """Start (or restart, from its append-only file) the stack's Redis on its port."""
        return self.procs.redis(self.redis_port, self.root.parent / "redis", aof=self.aof)

    def kill_redis(self) -> None:
        self.procs.stop(f"redis-{self.redis_port}", signal.SIGKILL)

    def sim(self, name: str, profile: str = "qwen3-vl-8b", *args: str, port: int | None = None) -> str:
        url = self.procs.sim(name, port or free_port(), "--profile", profile, *args)
        wait_health(url, 20)
        return url

    def worker(
        self, name: str, server: str, *args: str, env: dict[str, str] | None = None, wrapper: list[str] | None = None
    ) -> subprocess.Popen[bytes]:
        """A worker process; `wrapper` replaces `python -m workers.main` (faulty_worker.command(...))."""
        start = wrapper or [sys.executable, "-m", "workers.main"]
        argv = [*start, "--server", server, "--name", name, *args]
        return self.procs.start(name, argv, env={**self.env, **(env or {})})

    def piped_worker(
        self, name: str, argv: list[str], env: dict[str, str]
    ) -> tuple[subprocess.Popen[bytes], Callable[[], str]]:
        """Start `argv` (a worker, maybe under a wrapper) with its log on a pipe, which no file-size limit on
        the test's files touches; returns the process and a reader of its log so far."""
        proc = subprocess.Popen(argv, env={**os.environ, **self.env, **env}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        self.procs.adopt(name, proc)
        out: list[bytes] = []
        pipe = proc.stdout
        assert pipe is not None
        threading.Thread(target=lambda: out.extend(iter(pipe.readline, b"")), daemon=True).start()
        return proc, lambda: b"".join(out).decode(errors="replace")

    def enqueue(
        self, step: int, chunk_size: int = 64, limit: int | None = None, results: Path | None = None
    ) -> Produced:
        """What `pool-enqueue --step N` does, through the producer's library function."""
        store = Store(results or self.store.root, P.fingerprint, P.model_dump(mode="json"))
        store.claim()
        screen = screen_of(store, self.conn)
        assert screen is not None
        rescue_abandoned(P, screen)
        frames = self.root / "frames" / "pool_frames"
        return produce(P, step, load_items(self.root / "items"), store, screen, frames, chunk_size, limit=limit)

    def wait_workers(self, names: list[str], timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        for n in names:
            rc = self.procs.children[n].wait(max(1, deadline - time.monotonic()))
            assert rc == 0, self.log(n)

    def log(self, name: str, tail: int = 4000) -> str:
        return (self.procs.log_dir / f"{name}.log").read_text()[-tail:]

    def winners(self, step: int) -> dict[str, dict]:
        w = self.store.winners(step)
        rows = self.store.read_rows(step, w)
        return {r["item_id"]: r for r in rows}

    def raw_count(self, step: int) -> int:
        return self.store.index(step).num_rows

    @property
    def screen(self) -> Screen:
        screen = screen_of(self.store, self.conn)
        assert screen is not None, "nothing stamped the results root yet"
        return screen

    def waiting(self, step: int) -> int:
        return self.conn.llen(self.screen.queue(step).key)

    def queued(self) -> int:
        return sum(self.waiting(step) for step in (1, 2, 3))


def cli(stack: Stack, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **stack.env}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def running(stack: Stack, step: int = 1) -> dict[str, Job]:
    """Jobs in the started registry, read without RQ's cleanup (which would rescue them itself)."""
    ids = stack.screen.queue(step).started_job_registry.get_job_ids(cleanup=False)
    return {j.id: j for j in Job.fetch_many(ids, connection=stack.conn, serializer=JSONSerializer) if j is not None}
