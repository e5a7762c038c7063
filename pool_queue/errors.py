"""One error tree: what went wrong, and whose move it is.

A `PoolError` is what a command reports as one line on stderr and exit 2 (`cli.reports_errors`), never
a traceback; its two branches say what the user can do. An `ItemFailure` is one item's and becomes
that item's error row: it never reaches a command. Every class of the tree is defined here, so one module
answers "what can go wrong and whose move is it"; the third column begins with the code that raises it (the
worker's leaves, "worker:", are raised in `workers/`, which the product's modules never import). Signals
outside the tree stay in their own module. Here is the whole tree:

    Exception
    ├── PoolError                    errors              one line on stderr, exit 2: the message says what to change
    │   ├── InputError               errors              the package root's contents: fix or replace them
    │   │   ├── ItemsError           errors              inputs.items: an item file unusable as a whole (columns,
    │   │   │                                            unreadable)
    │   │   ├── FrameError           errors              inputs.frames: a frame file or folder that cannot be used,
    │   │   │                                            named with why
    │   │   ├── ShardError           errors              inputs.shards: a frame shard or its manifest, cut short or
    │   │   │                                            damaged
    │   │   ├── ProtocolError        errors              protocol: a protocol file, naming the file and the field
    │   │   └── StoreError           errors              store.store: a results root that is not ours to write
    │   │                                                (stamp, protocol)
    │   └── SetupError               errors              a setting, server or Redis: fix the setting or start it
    │       ├── ServerMisconfigured  errors              worker: 401/404 or a model mismatch: the worker stops (a
    │       │                                            job in hand goes back; mid-run exit 3: it stays down)
    │       ├── ServerUnreachable    errors              worker: no vLLM answered within the start's wait
    │       └── RedisGone            errors              worker: Redis silent past the wait (at start exit 2,
    │                                                    mid-run exit 4: pool-launch starts it again)
    ├── ItemFailure                  errors              one item's error row, `kind` from the class; never a command's
    │   ├── ForwardError             errors              worker: cannot succeed for this item (HTTP 400): permanent
    │   └── RetriesExhausted         errors              worker: transient failures used the attempts: transient,
    │                                                    a later run re-attempts it
    └── outside the tree: signals inside one component, never shown to a user as such
        ├── StoreWriteError(OSError) store.store         rows not on disk (full, read-only): the job goes
        │                                                back and the worker holds until the disk takes rows
        ├── BatchFailed              workers.client      a batch request fell short: its items go one by one
        ├── Stopped                  workers.waiting     a signal ended a wait that guarded no work
        └── SimError                 sim.checks          the simulator's HTTP error answer (status, type)
    KeyboardInterrupt
    └── Interrupted                  proc.procs          SIGTERM or SIGHUP taking Ctrl-C's path: a command stops
                                                         what it started and exits 128 + the signal (143, 129)

The `InputError` leaves are also `ValueError`s (`StoreError` a `RuntimeError`, `RedisGone` too), so code
that catches the builtin keeps working. A new error the user can act on subclasses `InputError` or
`SetupError`, never `PoolError` or `Exception` directly: the branch is what tells the user whose move it is.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rows pulls in pyarrow: every command imports this module, the simulator too
    from .rows import ErrorKind


class PoolError(Exception):
    """An error the user can act on; the message says what to change."""


class InputError(PoolError):
    """The package root's contents (items, frames, shards, protocol file, results root): fix or replace them."""


class SetupError(PoolError):
    """A setting, a server or Redis that does not fit or does not answer: fix the setting or start the service."""


class ItemFailure(Exception):
    """One item's forward failed for good; `kind` goes into its error row (rows.ErrorKind)."""

    kind: ErrorKind = "permanent"


# The input leaves (raised where each input is read: inputs/, protocol, store/).


class ItemsError(InputError, ValueError):
    """A whole input file is unusable (missing columns, unreadable): nothing in it can be judged."""


class FrameError(InputError, ValueError):
    """A frame file or folder that cannot be used; the message names it and says why."""


class ShardError(InputError, ValueError):
    """A frame shard or its manifest, cut short or damaged; the message names the file."""


class ProtocolError(InputError, ValueError):
    """A protocol file that cannot be used; the message is one line naming the file and the field."""


class StoreError(InputError, RuntimeError):
    """A results root that is not this screen's to write (another protocol's stamp, a damaged stamp)."""


# The worker's leaves (raised in `workers/`).


class ServerMisconfigured(SetupError):
    """401/404 from the server or a model mismatch: no item is at fault, the worker must stop."""


class ServerUnreachable(SetupError):
    """At start: no vLLM answered within the wait, or something answered that is not an HTTP server."""


class RedisGone(SetupError, RuntimeError):
    """Redis did not answer for longer than the worker is willing to wait."""


class ForwardError(ItemFailure):
    """A forward that cannot succeed for this item (HTTP 400, no logprobs): an error row at once
    (ItemFailure's kind, permanent)."""


class RetriesExhausted(ItemFailure):
    """Transient failures used up the attempts: an error row a later run re-attempts (not a ForwardError)."""

    kind: ErrorKind = "transient"

    def __init__(self, message: str, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


def folder_trouble(folder: Path, e: OSError) -> str:
    """Why `folder` cannot be made or take a file, in words a user can act on, instead of the OS's message
    about whichever file the attempt touched (".PROTOCOL.json.host.123.456: Read-only file system")."""
    if e.errno in (errno.EEXIST, errno.ENOTDIR):  # the folder, or a folder above it, is a file
        blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), folder)
        return "is a file, not a folder" if blocker == folder else f"cannot be made: {blocker} is a file, not a folder"
    words = {
        errno.EROFS: "is on a read-only file system",
        errno.EACCES: "may not be written by this user (permission denied)",
        errno.EPERM: "may not be written by this user (operation not permitted)",
        errno.ENOSPC: "is on a full disk",
        errno.EDQUOT: "is on a disk whose quota is used up",
    }
    return words.get(e.errno or 0, f"cannot be written ({e.strerror or e})")
