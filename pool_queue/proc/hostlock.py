"""One demo per root, one launcher per host, root and PORT0: an OS file lock held by the running process.

The lock is `flock` on a file the holder keeps open, so the kernel drops it when the process ends, a crash or
SIGKILL included: nothing is left behind to clean up (a pid file would be). The file lives on this host (in
$XDG_RUNTIME_DIR, else the temporary folder), named by a hash of the resolved root (and the launcher's
PORT0): network filesystems often lack working locks, and several hosts share one root by design, each with
its own launcher. The holder writes its pid and command line into the file, so a refusal names it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sys
import tempfile
from pathlib import Path
from typing import IO

from ..errors import SetupError

_held: list[IO[str]] = []  # open for the life of the process: closing a file drops its lock


def lock_dir() -> Path:
    """A host-local folder of this user's: $XDG_RUNTIME_DIR (tmpfs, per user) if usable, else the temp folder."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK):
        return Path(runtime) / "pool-queue"
    return Path(tempfile.gettempdir()) / f"pool-queue-{os.getuid()}"


def hold(what: str, root: Path, *key: object) -> Path:
    """Take the lock on (`what`, root, key...) for the rest of this process, or raise SetupError (one line,
    exit 2) naming the process that holds it. Returns the lock file's path."""
    path = _lock_file(what, root, *key)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    f = path.open("a+")  # never truncated before the lock is ours: the holder's line stays readable
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "a process that has not written its name yet"
        f.close()
        on = f"root {root}" + "".join(f", {k}" for k in key)
        raise SetupError(f"{what} is already running on this host for {on}: {holder}; wait for it or stop it") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} ({' '.join(sys.argv)})\n")
    f.flush()
    _held.append(f)
    return path


def is_held(what: str, root: Path, *key: object) -> bool:
    """Whether a live process on this host holds (`what`, root, key...) now: a `.env` that pool-demo wrote
    points at a demo that still runs, or at one whose Redis is gone with it."""
    try:
        with _lock_file(what, root, *key).open() as f:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)  # dropped as the file closes
    except BlockingIOError:
        return True
    except OSError:  # no lock file: never taken on this host since its temporary folder was made
        return False
    return False


def _lock_file(what: str, root: Path, *key: object) -> Path:
    ident = "\0".join([what, str(root.resolve()), *map(str, key)])
    return lock_dir() / f"{what}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.lock"
