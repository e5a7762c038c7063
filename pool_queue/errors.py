"""One error tree: what went wrong, and whose move it is.

A `PoolError` is what a command reports as one line on stderr and exit 2 (`cli.reports_errors`), never
a traceback; its two branches say what the user can do. An `ItemFailure` is one item's and becomes
that item's error row: it never reaches a command.
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
