"""Redis memory a screen needs: every job of every step present at once (waiting, running, or finished
within the hour its hash is kept), as at the peak of a screen whose steps overlap.

Enqueues N item ids into step 1 in jobs of 64, then the survivors' follow-up jobs as workers make them
(one per parent job: ~61 % of items reach step 2, ~40 % step 3, per h200.md's step sizes), into a real
redis-server, and prints used memory per step and per 100,000 items.
Usage: python benchmarks/redis_memory.py [--items 100000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import table
from redis import Redis

from pool_queue.jobs.queue import screen_of
from pool_queue.proc.procs import Procs, free_port
from pool_queue.protocol import Protocol
from pool_queue.store.store import Store

P = Protocol()
REACH = {1: 1.0, 2: 0.61, 3: 0.40}  # share of the pool's items each step sees


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--items", type=int, default=100_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, Procs(Path(d) / "logs") as procs:
        store = Store(Path(d) / "results", P.fingerprint, P.model_dump(mode="json"))
        store.claim()
        conn = Redis.from_url(procs.redis(free_port(), Path(d) / "redis"))
        screen = screen_of(store, conn)
        assert screen is not None
        used = lambda: int(conn.info("memory")["used_memory"]) / 2**20  # noqa: E731
        base, rows = used(), []
        ids = [f"benchmark-{i % 139:03d}/item-{i:07d}" for i in range(args.items)]  # ids as long as real ones
        for step, share in REACH.items():
            n = int(args.items * share)
            chunk = 64 if step == 1 else max(1, round(64 * share))  # a follow-up holds one parent's survivors
            before = used()
            jobs = screen.enqueue_chunks(step, ids[:n], chunk)
            rows.append([f"step {step}", n, jobs, used() - before])
        total = used() - base
        rows.append(["all steps", args.items, sum(r[2] for r in rows), total])
        print(table(["jobs of", "items", "jobs", "Redis MB"], rows))
        print(f"{total / args.items * 100_000:.1f} MB of Redis memory per 100,000 items of the pool")


if __name__ == "__main__":
    main()
