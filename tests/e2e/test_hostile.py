"""A hostile pool (tests/harness/hostile.py: ~90 kinds of messy items and frames) screened to the end over real
Redis, simulators and workers: no job fails, every valid item is settled at each step it reaches, every
invalid one is named with a reason, and the package root is byte-identical afterwards."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hostile import add_hostile
from rq.registry import FailedJobRegistry
from stack import FAST, P, Stack

from pool_queue.demo.synth import SynthConfig, generate
from pool_queue.inputs.items import load_items
from pool_queue.jobs.plan import eligible

pytestmark = pytest.mark.slow  # a whole screen of a hostile pool, then every command

STEPS = sorted(P.steps)


def tree_hash(root: Path) -> dict[str, str]:
    """Every file and link of the package except what a screen may write (results/, logs/)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        if rel == Path("."):
            dirnames[:] = [d for d in dirnames if d not in ("results", "logs")]
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p.is_symlink():
                out[str(rel / name)] = "link:" + os.readlink(p)
            elif p.is_file():
                out[str(rel / name)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_a_hostile_pool_screens_to_the_end(procs, tmp_path):
    root = tmp_path / "root"
    generate(root, SynthConfig(n_items=120, n_videos=30, seed=5, frames=(8, 40)))
    kinds = add_hostile(root)
    assert len({k.name for k in kinds}) >= 40
    before = tree_hash(root)
    items = load_items(root / "items")
    reasons: dict[str, list[tuple[str, int]]] = {}
    for r in items.rejected.to_pylist():
        reasons.setdefault(r["item_id"], []).append((r["reason"], r["line"]))
    stack = Stack(root, procs)
    s8 = stack.sim("sim8", "qwen3-vl-8b", "--speed", "20")
    s2 = stack.sim("sim2", "qwen3-vl-2b", "--speed", "50")
    stack.enqueue(1)
    names = {"w8": s8, "w2": s2}
    for name, url in names.items():
        stack.worker(name, url, env=FAST)
    deadline = time.monotonic() + 300
    store, frames = stack.store, root / "frames" / "pool_frames"
    while stack.screen.busy(STEPS) or any(
        len(eligible(P, s, items.items, store, frames)) > len(store.settled(s)) for s in STEPS
    ):
        assert time.monotonic() < deadline and all(procs.children[n].poll() is None for n in names)
        time.sleep(0.5)
    logs = {n: stack.log(n, tail=10**7) for n in names}
    for q in (stack.screen.queue(s) for s in STEPS):
        assert FailedJobRegistry(queue=q).count == 0
    assert not any("raised (run" in text or "internal error" in text for text in logs.values()), logs
    winners = {s: stack.winners(s) for s in STEPS}
    for step in STEPS:  # every valid item is settled at each step it reaches
        elig = set(eligible(P, step, items.items, store, frames).column("item_id").to_pylist())
        assert elig <= set(winners[step]), (step, elig - set(winners[step]))
        assert all(r["status"] == "ok" or r["error_kind"] in ("bad_input", "permanent") for r in winners[step].values())
    seen = set()
    for k in kinds:
        seen.add(k.name)
        if k.expect == "rejected":
            found = reasons.get(k.item_id, [])  # at the file line an editor shows, where the kind names one
            assert any(k.reason in why and k.line in (0, line) for why, line in found), (k, found)
            continue
        row1 = winners[1][k.item_id]
        if k.expect == "ok":
            assert row1["status"] == "ok", (k, row1["error"])
        elif k.expect.startswith("ok:"):
            row = winners[int(k.expect.split(":")[1])][k.item_id]
            assert row1["removed"] is False and row["status"] == "ok", (k, row["error"])
        elif k.expect == "no-frames":
            assert row1["status"] == "ok" and row1["removed"] is False and k.item_id not in winners[2], k
        else:
            step = int(k.expect.split(":")[1])
            if step > 1:  # the fixture's questions keep these items at step 1
                assert row1["status"] == "ok" and row1["removed"] is False, (k, row1)
            row = winners[step][k.item_id]
            assert row["status"] == "error" and k.reason in row["error"], (k, row["error"])
    assert len(seen) >= 40
    said = _every_command_answers(stack, root)
    for k in kinds:
        assert k.warning in said, k
    assert tree_hash(root) == before  # nothing written beside the inputs; links were never followed out


def _every_command_answers(stack: Stack, root: Path) -> str:
    """Every command that lists the cache or reads the items works on this root: no traceback, and the
    report's tables keep their columns whatever the benchmark names hold. Returns what pool-items said."""
    bin_ = Path(sys.executable).parent
    env = {**os.environ, **stack.env, "COLUMNS": "400"}
    said = ""
    out = root.parent / "out"
    for argv in (["pool-items"], ["pool-status", "--no-health"], ["pool-status", "--json", "--no-health"],
                 ["pool-audit"], ["pool-enqueue", "--step", "all", "--plan-only"], ["pool-report", "--out", str(out)],
                 ["pool-export", "--out", str(out / "export")]):  # fmt: skip
        done = subprocess.run([str(bin_ / argv[0]), *argv[1:]], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode in (0, 1) and "Traceback" not in done.stderr, (argv, done.stderr[-3000:])
        said += done.stdout if argv[0] == "pool-items" else ""
    report = (out / "report.md").read_text()
    assert "Odd\\|Bench Name" in report
    for table in (block for block in report.split("\n\n") if block.startswith("| ")):
        widths = {line.count(" | ") for line in table.splitlines() if not line.startswith("|---")}
        assert len(widths) == 1, table  # every row has the head's columns
    return said
