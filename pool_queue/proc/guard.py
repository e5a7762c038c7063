"""What outlives a command: its child process groups as /proc shows them, and the guard that stops them.

Every child that `procs.Procs` starts leads its own session and process group (so a Ctrl-C at the
terminal reaches only the command, which stops them in order). A command that dies without stopping
them (SIGKILL, the OOM killer) would leave them running with PPID 1: so each `Procs` starts one guard,
`python -m pool_queue.proc.guard`, in a session of its own, and tells it on a pipe which groups it started
("+ PID START") and stopped ("- PID"). When the pipe closes (the command is gone, however it went),
the guard stops the groups still listed as `Procs.stop_all` would (last started first, SIGTERM, then
SIGKILL after a bounded wait), and removes the command's record of them. A group is named by its
leader's pid and start time, so a pid the kernel hands out again is never signalled. The module
imports nothing heavy: the guard starts at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")
STOP_WAIT_S = 5.0  # as Procs.stop_all gives each child: a worker's in-flight jobs may finish meanwhile


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None when it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    return text.rpartition(")")[2].split()


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot): with the pid, names one process for good."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def members(group: int, start: int) -> list[int]:
    """The live (not zombie) processes of the process group whose leader was `group`, started at `start`.
    The kernel hands out no pid still naming a group, so a leader that exited leaves its group's id to its
    members; a leader pid alive with another start time is a new process, and its group not ours."""
    leader = _stat(group)
    if leader is not None and leader[0] != "Z" and int(leader[19]) != start:
        return []
    found = []
    for d in PROC.iterdir():
        if d.name.isdigit() and (f := _stat(int(d.name))) is not None and f[0] != "Z" and int(f[2]) == group:
            found.append(int(d.name))
    return found


def listening_ports(pids: Iterable[int]) -> list[int]:
    """The TCP ports these processes listen on (their sockets' inodes in /proc/net/tcp and tcp6)."""
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in (PROC / str(pid) / "fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in (PROC / "net" / table).read_text().splitlines()[1:]:
                f = line.split()
                if f[3] == "0A" and f[9] in inodes:  # 0A: LISTEN
                    ports.add(int(f[1].rpartition(":")[2], 16))
    return sorted(ports)


def stop_groups(groups: list[tuple[int, int]], wait_s: float = STOP_WAIT_S) -> None:
    """Each (leader pid, start) group in turn: SIGTERM, then SIGKILL if it still runs after `wait_s`."""
    for group, start in groups:
        if not members(group, start):
            continue
        _signal(group, signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        while members(group, start) and time.monotonic() < deadline:
            time.sleep(0.1)
        if members(group, start):
            _signal(group, signal.SIGKILL)


def _signal(group: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


def watch(lines: Iterable[str]) -> None:
    """Follow the command's "+ PID START" / "- PID" lines; at their end, stop the groups still listed."""
    live: dict[int, int] = {}
    for line in lines:
        match line.split():
            case ["+", pid, start]:
                live[int(pid)] = int(start)
            case ["-", pid]:
                live.pop(int(pid), None)
    stop_groups(list(reversed(live.items())))


def main() -> None:
    """`python -m pool_queue.proc.guard RECORD`: RECORD (what the command's `Procs` records as running) is
    removed once what it names is stopped."""
    for sig in (signal.SIGINT, signal.SIGHUP):  # only the pipe's end (or SIGTERM, SIGKILL to it) ends a guard
        signal.signal(sig, signal.SIG_IGN)
    watch(sys.stdin)
    Path(sys.argv[1]).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
