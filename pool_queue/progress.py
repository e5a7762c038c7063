"""Progress bars with rate and ETA (rich), shared by every long operation."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

console = Console(stderr=True)


@contextmanager
def _progress(
    label: str, total: int, show: bool, amount: tuple[ProgressColumn, ...]
) -> Iterator[Callable[[int], None]]:
    columns = (TextColumn(label), BarColumn(), *amount, TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console, disable=not show) as p:
        task = p.add_task(label, total=total)
        yield lambda n: p.advance(task, n)


def byte_progress(label: str, total: int, show: bool = True) -> AbstractContextManager[Callable[[int], None]]:
    return _progress(label, total, show, (DownloadColumn(), TransferSpeedColumn()))


def count_progress(label: str, total: int, show: bool = True) -> AbstractContextManager[Callable[[int], None]]:
    return _progress(label, total, show, (MofNCompleteColumn(), TaskProgressColumn()))
