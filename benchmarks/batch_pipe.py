"""Step 3 on the simulator: a video's items as batch requests against one request per forward
(`POOL_BATCH=off`), by forwards in flight and items per video.

Each cell screens the same items twice, once per shape, each time with one pool-worker (--burst) through
Redis against a fresh `pool-sim` (empty caches, the 2B's capacity model run `--speed` times faster). It
prints items/s from the first row started to the last row written, and the server's mean running
requests over that time (its `pool_sim:running_seconds_total`): what the pipe held, against the bound.
Usage: python benchmarks/batch_pipe.py [--inflight 8,32,64] [--per-video 1,3,8,15] [--items 64] [--speed 100]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx
from redis import Redis

sys.path.insert(0, str(Path(__file__).parent))
from _pool import P, pool_items
from _util import table

from pool_queue.jobs.queue import screen_of
from pool_queue.proc.procs import Procs, free_port, wait_health
from pool_queue.store.store import Store

STEP = 3
SHAPES = {"batch": "auto", "off": "off"}  # the workers' POOL_BATCH


@dataclass(frozen=True)
class Run:
    items: int  # rows on disk
    errors: int
    wall: float
    mean_running: float  # the server's running requests, averaged over the run

    @property
    def items_s(self) -> float:
        return self.items / self.wall if self.wall > 0 else 0.0


def running_seconds(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("pool_sim:running_seconds_total"))


def screen_once(procs: Procs, redis_url: str, root: Path, ids: list[str], videos: list[str], inflight: int,
                shape: str, args: argparse.Namespace, tag: str) -> Run:  # fmt: skip
    """One worker screens `ids` at step 3 against a fresh simulator."""
    url = procs.sim(f"sim-{tag}", free_port(), "--profile", "qwen3-vl-2b", "--max-num-seqs", str(args.max_num_seqs),
                    "--speed", str(args.speed))  # fmt: skip
    wait_health(url, 60)
    results = root.parent / "results" / tag
    store = Store(results, P.fingerprint, P.model_dump(mode="json"))
    store.claim()
    screen = screen_of(store, Redis.from_url(redis_url))
    assert screen is not None
    screen.enqueue_chunks(STEP, ids, 64, videos=videos)
    argv = [sys.executable, "-m", "workers.main", "--server", url, "--steps", str(STEP), "--burst"]
    argv += ["--inflight", str(inflight), "--root", str(root), "--results", str(results), "--redis-url", redis_url]
    busy0 = running_seconds(url)
    if procs.start(f"w-{tag}", [*argv, "--name", tag], env={"POOL_BATCH": SHAPES[shape]}).wait() != 0:
        raise SystemExit(f"the {shape} worker failed (logs under {procs.log_dir})")
    busy = running_seconds(url) - busy0
    procs.stop(f"sim-{tag}")
    rows = Store(results, P.fingerprint).winners(STEP)
    t0, t1 = min(rows.column("started_at").to_pylist()), max(rows.column("finished_at").to_pylist())
    errors = sum(s != "ok" for s in rows.column("status").to_pylist())
    return Run(rows.num_rows, errors, t1 - t0, busy / (t1 - t0) if t1 > t0 else 0.0)


def ints(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every number must be 1 or more")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inflight", type=ints, default=[8, 32, 64], help="forwards in flight of the worker")
    ap.add_argument("--per-video", type=ints, default=[1, 3, 8, 15], help="items per video of each pool")
    ap.add_argument("--items", type=int, default=64, help="items each run screens (whole videos)")
    ap.add_argument("--speed", type=float, default=100.0, help="the simulator's --speed")
    ap.add_argument("--max-num-seqs", type=int, default=256, help="the simulator's, above any bound measured")
    ap.add_argument("--root", type=Path, help="where the pools and results go (default: a temporary folder)")
    args = ap.parse_args()
    if args.items < 1:
        ap.error("--items must be 1 or more")
    base = args.root or Path(tempfile.mkdtemp(prefix="pool-batch-pipe-"))
    rows: list[list[object]] = []
    with Procs(base / "logs") as procs:
        redis_url = procs.redis(free_port(), base / "redis")
        for pv in args.per_video:
            root = base / f"pool-{pv}" / "root"
            n = -(-args.items // pv) * pv  # whole videos
            items = pool_items(root, STEP, n, per_video=pv, real_frames=True)[:n]
            ids, videos = [it["item_id"] for it in items], [it["video_id"] for it in items]
            for inflight in args.inflight:
                got = {s: screen_once(procs, redis_url, root, ids, videos, inflight, s, args, f"{s}-{pv}-{inflight}")
                       for s in SHAPES}  # fmt: skip
                b, o = got["batch"], got["off"]
                rows.append([inflight, pv, n, o.items, b.items, o.errors + b.errors, o.items_s, b.items_s,
                             b.items_s / o.items_s if o.items_s else 0.0, o.mean_running, b.mean_running])  # fmt: skip
    print(f"step {STEP} on pool-sim --speed {args.speed:g} --max-num-seqs {args.max_num_seqs}, one worker per run")
    print(table(["in flight", "items/video", "items", "screened off", "screened batch", "errors", "off items/s",
                 "batch items/s", "batch/off", "off running", "batch running"], rows))  # fmt: skip


if __name__ == "__main__":
    main()
