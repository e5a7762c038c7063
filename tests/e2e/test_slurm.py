"""deploy/slurm on a real one-node Slurm: the Redis job, node jobs joining one screen, drain on SIGTERM.

The simulated server stands in for vLLM (POOL_SIM=1) and the installed project for the Apptainer
image (POOL_IMAGE=none): the two documented switches of node.sbatch.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from slurm_local import LocalSlurm

from pool_queue.inputs.items import load_items
from pool_queue.observe.audit import run_audit
from pool_queue.proc.procs import free_port
from pool_queue.protocol import Protocol
from pool_queue.store.store import Store

REPO = Path(__file__).resolve().parents[2]
SLURM = REPO / "deploy" / "slurm"
P = Protocol()
SMALL = ("--cpus-per-task=1", "--mem=1G")  # the scripts ask for a GPU node's share; this node is small
NODE = ("--gres=gpu:1", "--cpus-per-gpu=1", "--mem=1G")  # a node job's GPU, and less than its 16 cores per GPU
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm")]  # one cluster: one xdist worker


def _final(root: Path, step: int) -> int:
    return len(Store(root / "results" / "pool", P.fingerprint).final_ids(step, 4))


def _log(out: Path, job: int) -> str:
    f = out / f"node-{job}.log"
    return f.read_text() if f.exists() else f"(no {f.name} yet)"


def test_node_jobs_screen_a_pool_to_the_end_and_drain_on_sigterm(pool_root, tmp_path):
    env = {
        "POOL_ROOT": str(pool_root),
        "REDIS_PASSWORD": "slurm-s3cret",
        "REDIS_PORT": str(free_port()),
        "PY": sys.executable,
        "POOL_SIM": "1",
        "POOL_IMAGE": "none",
        "NGPU": "1",
        "PYTHONUNBUFFERED": "1",
    }
    out = tmp_path / "out"
    out.mkdir()
    with LocalSlurm(tmp_path / "slurm") as slurm:
        redis_job = slurm.submit(SLURM / "redis.sbatch", *SMALL, f"--output={out}/redis-%j.log", env=env)
        url_file = pool_root / "logs" / "redis_url"
        deadline = time.monotonic() + 60
        while not url_file.exists():
            assert time.monotonic() < deadline, (out / f"redis-{redis_job}.log").read_text()
            time.sleep(0.5)
        # two node jobs (capacity added by submitting more) share one screen of steps 1-2
        first = {**env, "MODEL_STEP": "1"}
        nodes = [slurm.submit(SLURM / "node.sbatch", *NODE, f"--output={out}/node-%j.log", env=first) for _ in range(2)]
        for job in nodes:
            assert slurm.wait(job, 300) == ("COMPLETED", "0:0"), _log(out, job)
        logs = [(out / f"node-{j}.log").read_text() for j in nodes]
        assert any("REMAINING_TOTAL=0" in text for text in logs), logs
        for text in logs:  # what it got, what the plan wants, and a warning
            assert "pool-node: 1 cores for 1 GPU(s) (the plan wants 16 per GPU)" in text, text
            assert "warning: fewer cores than the plan wants" in text, text
        assert "slurm-s3cret" not in "".join(logs)
        per_node = sorted(p.name for p in (pool_root / "logs").iterdir() if p.is_dir())
        assert len(per_node) == 2 and all((pool_root / "logs" / d / "vllm_s1_gpu0.log").exists() for d in per_node)

        # step 3 on a node job that runs until Slurm's signal: it drains and ends cleanly
        keep = {**env, "MODEL_STEP": "3", "POOL_KEEP_RUNNING": "1"}
        job = slurm.submit(SLURM / "node.sbatch", *NODE, f"--output={out}/node-%j.log", env=keep)
        items = load_items(pool_root / "items")
        frames = pool_root / "frames" / "pool_frames"
        deadline = time.monotonic() + 300
        while run_audit(pool_root / "results" / "pool", P, items, frames, show=False).warnings:
            assert time.monotonic() < deadline and slurm.state(job)[0] in ("PENDING", "RUNNING"), _log(out, job)
            time.sleep(2)
        assert slurm.run("scancel", "--signal=TERM", "--batch", str(job)).returncode == 0
        assert slurm.wait(job, 120) == ("COMPLETED", "0:0"), _log(out, job)
        assert "draining" in _log(out, job)
        slurm.run("scancel", str(redis_job))

    audit = run_audit(pool_root / "results" / "pool", P, items, frames, complete=True, show=False)
    assert audit.problems == [] and audit.warnings == [], audit
    assert _final(pool_root, 1) == items.items.num_rows and _final(pool_root, 3) > 0
