"""A seeded fault run in the suite: a 2,000-item, three-step screen through 12 faults (kill -9 of
workers after they heartbeated, of simulators and of Redis, one FLUSHALL followed by the README's
recovery), finishing with nothing done by hand. The harness is benchmarks/chaos.py."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
from chaos import Config, run_chaos  # noqa: E402


def test_a_screen_survives_seeded_faults_and_lands_exactly(tmp_path: Path) -> None:
    cfg = Config(items=2000, videos=400, faults=12, seed=7)
    rep = run_chaos(cfg, tmp_path)
    kinds = " ".join(rep.faults)
    assert len(rep.faults) == 12, rep.faults  # every scheduled fault fired before the screen ended
    assert kinds.count("kill -9 w") >= 5 and kinds.count("kill -9 sim") == 2
    assert kinds.count("kill -9 redis") == 2 and kinds.count("FLUSHALL") == 1
    assert rep.items_lost == 0 and rep.wrong == 0  # one settled row per item and step, equal to the reference
    assert rep.dup_disagreeing == 0  # repeated work may repeat rows, never with another answer
    assert rep.audit_ok, rep.audit_tail
    # README: back on a queue within lease + one rescue pass (+ the rescuing loop), unless Redis itself
    # was away meanwhile (no rescue runs then): those get the Redis restart's time on top
    assert rep.back_queued_s and max(rep.back_queued_s) <= cfg.lease_s + cfg.rescue_s + 1.5, rep.back_queued_s
    assert all(t <= cfg.lease_s + cfg.rescue_s + 8 for t in rep.back_queued_overlapped_s), rep.back_queued_overlapped_s
