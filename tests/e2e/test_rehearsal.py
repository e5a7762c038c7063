"""The rehearsal in the suite, small: a 3,000-item pool of the real shape through every stage of
tests/harness/rehearsal_run.py, which benchmarks/rehearsal.py runs large (synth, enqueue, the screen with
status refreshes, a FLUSHALL and its recovery, a worker killed, report, audit, export, pack), ending
complete and equal to the reference."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from reference import expected
from rehearsal_run import Config, proc_sample, run_rehearsal

from pool_queue.inputs.items import load_items
from pool_queue.protocol import Protocol
from pool_queue.store.store import Store


@pytest.mark.slow
def test_a_small_rehearsal_runs_every_stage_and_lands_exactly(tmp_path: Path) -> None:
    rep = run_rehearsal(Config(items=3000, flush_at=0.3, kill_at=0.5, status_every_s=1.0), tmp_path)
    assert set(rep.stages) == {"synth", "enqueue", "status", "recovery", "screen", "report", "audit", "export", "pack"}
    assert len(rep.faults) == 2 and rep.faults[0].startswith("FLUSHALL + pool-enqueue --step all at ")
    assert rep.faults[1].startswith("kill -9 w")
    assert rep.complete and rep.audit_ok and rep.pack_ok, (rep.steps, rep.audit_tail)
    assert set(rep.kinds) == {"simulated server", "redis", "worker 8B", "worker 2B"}
    assert all(c.rss_mb > 0 for c in [*rep.stages.values(), *rep.kinds.values()])  # every process was measured
    assert rep.peak_rss_mb < 2048 and rep.redis_peak_mb > 0 and rep.status_s

    root = tmp_path / "pool"
    items = load_items(root / "items").items
    assert items.num_rows == 3000 and len(set(items.column("benchmark").to_pylist())) == 139  # the real shape
    frames = root / "frames" / "pool_frames"
    with_frames = sum(1 for v in items.column("video_id").to_pylist() if (frames / v).is_dir())
    assert 0.5 < with_frames / 3000 < 0.7  # ~61 % of the real pool's items have frames
    one = next(frames.iterdir())
    assert all(f.stat().st_nlink > 1 for f in one.iterdir() if f.suffix == ".jpg")  # hard links: no disk at size

    P = Protocol()
    store = Store(root / "results" / "pool", P.fingerprint)
    for step, want in expected(root).items():  # one settled row per item, the reference's verdicts
        got = {r["item_id"]: r for r in store.read_rows(step, store.winners(step))}
        assert {k: (r["status"], r["removed"]) for k, r in got.items()} == {k: ("ok", v[0]) for k, v in want.items()}
    exported = pq.read_table(tmp_path / "export" / "parquet" / "step1.parquet", columns=["item_id"])
    assert exported.num_rows == 3000


def test_a_process_sampled_as_it_exits_counts_as_gone() -> None:
    """An exiting process (a zombie) still has /proc/PID/status, without its memory lines."""
    live = proc_sample(os.getpid())
    assert live is not None and live[0] > 0 and live[1] > 0
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    stat = Path(f"/proc/{child.pid}/stat")
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":  # exited, not yet reaped
        time.sleep(0.01)
    assert proc_sample(child.pid) is None
    child.wait()
    assert proc_sample(child.pid) is None
