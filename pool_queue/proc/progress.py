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


def duration(span_s: float | None) -> str:
    """A span of time as people read it in a status line: `4m 05s`, `2h 03m`, `1d 4h`; None is `-`."""
    if span_s is None:
        return "-"
    span_s = int(span_s)
    if span_s >= 86400:
        return f"{span_s // 86400}d {span_s % 86400 // 3600}h"
    if span_s >= 3600:
        return f"{span_s // 3600}h {span_s % 3600 // 60:02d}m"
    return f"{span_s // 60}m {span_s % 60:02d}s"


def busy_time(span_s: float) -> str:
    """A step's time at work, as a table beside its items/s shows it: under a minute in seconds with one
    decimal (`0.8 s`: a small pool's step takes less than a second, and `0m 00s` beside its rate reads as a
    contradiction), longer as `duration` says it."""
    return f"{span_s:.1f} s" if span_s < 60 else duration(span_s)


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
