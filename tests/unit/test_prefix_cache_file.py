"""A worker's prefix-cache file on a disk that refuses it: named as a write, once, and written again once
the disk takes it (here a file standing where the folder goes, which refuses root too)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pool_queue.observe import prefix_cache


def test_a_refused_counters_file_is_said_once_as_a_write_and_written_once_it_can_be(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / prefix_cache.DIR).write_bytes(b"")  # no folder can be made here
    m = prefix_cache.Meter.for_worker(tmp_path, "w", "http://s")
    with caplog.at_level(logging.WARNING, logger="pool_queue.observe.prefix_cache"):
        m.charge((10.0, 1.0), {1: 5})
        for n in range(2, 5):
            m.charge((10.0 * n, 2.0 * n), {1: 5})
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith(f"writing the prefix-cache counters to {m.path} failed"), said
    (tmp_path / prefix_cache.DIR).unlink()
    m.charge((50.0, 10.0), {1: 5})
    assert prefix_cache.read(tmp_path)[1].queries == pytest.approx(40.0)
