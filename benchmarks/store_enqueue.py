"""Scale of the data paths: reads of a full step-1 store, enqueue of a full pool, status, report, audit.

Writes a step-1 store of N items (realistic rows: 4 forwards with their top-20 lists, spread over
16 segments), then times the done-set read cold (JSONL parsed) and warm (Parquet index), the
enqueue of N item ids into a real redis-server (goals: read < 3 s, enqueue < 30 s), a pool-status
read (first, and a refresh after 64 more rows as in a live view), pool-report and pool-audit.
Usage: python benchmarks/store_enqueue.py [--items 300000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import pyarrow as pa
from _util import table
from redis import Redis

from pool_queue.inputs.items import ITEM_SCHEMA, REPORT_SCHEMA, ItemSet
from pool_queue.jobs.queue import screen_of
from pool_queue.observe.audit import run_audit
from pool_queue.observe.markdown import write_report
from pool_queue.observe.status import StatusReader
from pool_queue.proc.procs import Procs, free_port
from pool_queue.protocol import Protocol
from pool_queue.store.store import Store

P = Protocol()
ORDERS = P.orders(1, "", 4)
TOP = [[f" {c}", -0.1 * i] for i, c in enumerate("ABCDEFGHIJKLMNOPQRST")]


def fake_row(i: int) -> dict[str, object]:
    fws = [
        {
            "order": order,
            "gold": "B",
            "logprobs": {"A": -1.0, "B": -0.2, "C": -3.0, "D": -4.0},
            "floored": [],
            "pred": "B",
            "margin": 0.8,
            "hit": True,
            "top": TOP,
            "prompt_tokens": 210,
            "attempts": 1,
            "latency_s": 0.2,
        }
        for order in ORDERS
    ]
    return {
        "item_id": f"item-{i:07d}",
        "step": 1,
        "status": "ok" if i % 500 else "error",
        "benchmark": f"B{i % 139}",
        "video_id": f"v{i % 67021}",
        "error": None,
        "error_kind": None,
        "attempts": 4,
        "removed": i % 3 == 0,
        "pred": "B",
        "margin": 0.8,
        "n_hits": 4,
        "n_perm": 4,
        "forwards": fws,
        "frame_indices": [],
        "n_frames_total": None,
        "fingerprint": P.fingerprint,
        "model": "Qwen/Qwen3-VL-8B-Instruct",
        "revision": "0c351dd",
        "server": "http://x:8001",
        "worker": "w",
        "started_at": 1.0,
        "finished_at": 2.0 + i,
    }


def fake_items(n: int) -> ItemSet:
    ids = [f"item-{i:07d}" for i in range(n + 64)]
    t = pa.table(
        {
            "item_id": ids,
            "benchmark": [f"B{i % 139}" for i in range(len(ids))],
            "video_id": [f"v{i % 67021}" for i in range(len(ids))],
            "question": ["q"] * len(ids),
            "options": [["a", "b", "c", "d"]] * len(ids),
            "gold": pa.array([1] * len(ids), pa.int16()),
            "n_options": pa.array([4] * len(ids), pa.int16()),
        },
        schema=ITEM_SCHEMA,
    )
    return ItemSet(t, REPORT_SCHEMA.empty_table(), len(ids))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--items", type=int, default=300_000)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        store = Store(Path(d) / "results", P.fingerprint)
        writers = [store.writer(1, f"w{k}") for k in range(16)]
        t0 = time.perf_counter()
        for b in range(0, args.items, 64):
            writers[(b // 64) % 16].write([fake_row(i) for i in range(b, min(args.items, b + 64))])
        t_write = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in store.segments(1)) / 2**20
        t0 = time.perf_counter()
        n_cold = len(Store(store.root, P.fingerprint).settled(1))
        t_cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        n_warm = len(Store(store.root, P.fingerprint).settled(1))
        t_warm = time.perf_counter() - t0
        rows.append(["done-set read, cold (JSONL)", n_cold, t_cold])
        rows.append(["done-set read, indexed", n_warm, t_warm])
        rows.append([f"write rows (64/fsync), {size:.0f} MB", args.items, t_write])
        with Procs(Path(d) / "logs") as procs:
            conn = Redis.from_url(procs.redis(free_port(), Path(d) / "redis"))
            screen = screen_of(store, conn)
            assert screen is not None  # the writers stamped the root
            ids = [f"item-{i:07d}" for i in range(args.items)]
            t0 = time.perf_counter()
            jobs = screen.enqueue_chunks(1, ids, 64)
            rows.append([f"enqueue ({jobs} jobs of 64)", args.items, time.perf_counter() - t0])
            t0 = time.perf_counter()
            again = screen.enqueue_chunks(1, ids, 64)
            rows.append([f"enqueue again ({again} new jobs)", args.items, time.perf_counter() - t0])
            rows.append([f"Redis memory MB: {int(conn.info('memory')['used_memory']) / 2**20:.0f}", jobs, 0.0])
            items = fake_items(args.items)
            t0 = time.perf_counter()
            reader = StatusReader(items, Store(store.root, P.fingerprint), Path(d) / "frames", conn, P)
            reader.read()
            rows.append(["pool-status, first read", args.items, time.perf_counter() - t0])
            writers[0].write([fake_row(i) for i in range(args.items, args.items + 64)])
            t0 = time.perf_counter()
            reader.read()
            rows.append(["pool-status, live refresh", args.items, time.perf_counter() - t0])
        t0 = time.perf_counter()
        write_report(Store(store.root, P.fingerprint), items, P, Path(d) / "report")
        rows.append(["pool-report (Markdown + 3 PNG)", args.items, time.perf_counter() - t0])
        t0 = time.perf_counter()
        audit = run_audit(store.root, P, items, Path(d) / "frames", show=False)
        rows.append([f"pool-audit ({len(audit.problems)} problems)", audit.rows, time.perf_counter() - t0])
    print(table(["operation", "items", "seconds"], rows))


if __name__ == "__main__":
    main()
