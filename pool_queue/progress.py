"""Progress bars with rate and ETA (rich), shared by every long operation."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

console = Console(stderr=True)


@contextmanager
def byte_progress(label: str, total: int, show: bool = True) -> Iterator[Callable[[int], None]]:
    columns = (
        TextColumn(label),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, disable=not show) as p:
        task = p.add_task(label, total=total)
        yield lambda n: p.advance(task, n)


@contextmanager
def count_progress(label: str, total: int, show: bool = True) -> Iterator[Callable[[int], None]]:
    columns = (
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, disable=not show) as p:
        task = p.add_task(label, total=total)
        yield lambda n: p.advance(task, n)
