"""Make a compatibility fixture (tests/data/compat-<commit>): what a results root and a Redis queue hold when
the checked-out code stopped after step 1. Run it from the repository root with the project's venv:

    .venv/bin/python tests/harness/make_compat.py tests/data/compat-<commit>

It writes `root/` (the synthetic pool, its frames_tar/ left out, with step 1's segment and the readers' index
of it) and `redis.json` (RQ's set of queues, every queue's list and the jobs they list, values as base64 of the
bytes Redis held, by type)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from stack import Stack

from pool_queue.demo.synth import SynthConfig, generate
from pool_queue.proc.procs import Procs

CONFIG = SynthConfig(
    n_items=30, n_videos=10, seed=7, frames=(4, 6), shard_videos=5, items_per_video=3, missing_fraction=0.0
)


def queued_keys(stack: Stack) -> list[bytes]:
    """The keys that hold the queued work: RQ's set of queues, each queue's list and the jobs it lists."""
    queues = sorted(stack.conn.keys("rq:queue:*"))
    jobs = [b"rq:job:" + i for q in queues for i in stack.conn.lrange(q, 0, -1)]
    return sorted([b"rq:queues", *queues, *jobs])


def dump(stack: Stack) -> dict[str, dict]:
    """The queued work's keys, read with HGETALL / LRANGE / SMEMBERS."""
    out: dict[str, dict] = {}
    for raw in queued_keys(stack):
        key = raw.decode()
        kind = stack.conn.type(raw).decode()
        if kind == "hash":
            value: object = {
                f.decode(): base64.b64encode(v).decode() for f, v in sorted(stack.conn.hgetall(raw).items())
            }
        elif kind == "list":
            value = [base64.b64encode(v).decode() for v in stack.conn.lrange(raw, 0, -1)]
        elif kind == "set":
            value = sorted(base64.b64encode(v).decode() for v in stack.conn.smembers(raw))
        else:
            raise SystemExit(f"{key}: a Redis type the fixture does not hold ({kind})")
        out[key] = {"type": kind, "value": value}
    return out


def main(out: Path) -> None:
    if out.exists():
        raise SystemExit(f"{out} exists already")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        generate(root, CONFIG)
        shutil.rmtree(root / "frames_tar")
        with Procs(Path(tmp) / "logs") as procs:
            stack = Stack(root, procs)
            stack.enqueue(1, chunk_size=6)
            stack.worker("w1", stack.sim("sim8", "qwen3-vl-8b"), "--steps", "1", "--burst")
            stack.wait_workers(["w1"])
            keys = dump(stack)
        export = [str(Path(sys.executable).parent / "pool-export"), "--out", str(Path(tmp) / "export")]
        subprocess.run(export, env={**stack.env, "PATH": str(Path(sys.executable).parent)}, check=True)
        out.mkdir(parents=True)
        shutil.copytree(root, out / "root", ignore=shutil.ignore_patterns("logs"))
        (out / "redis.json").write_text(json.dumps(keys, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
