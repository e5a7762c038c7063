"""One error tree: what went wrong, and whose move it is.

A `PoolError` is what a command reports as one line on stderr and exit 2 (`cli.reports_errors`), never
a traceback; its two branches say what the user can do. An `ItemFailure` is one item's and becomes
that item's error row: it never reaches a command.
"""

from __future__ import annotations

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
