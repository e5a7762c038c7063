"""End-to-end throughput of one step against one server, next to the ceiling a plain client reaches.

1. Ceiling: P plain processes (asyncio + httpx, no queue, no store) send the protocol's own request
   bodies for a set of items (frames prepared the workers' way, before the clock starts), C in
   flight each, the orders of one item adjacent.
2. System: Redis + `pool-enqueue`-style chunk jobs for *other* items (no prefix-cache help from
   step 1), W pool-worker processes (--burst), clock from the first row started to the last row on
   disk. Forwards/s, prompt tokens/s, % of the ceiling, worker CPU ms per forward, GPU busy
   (nvidia-smi utilization, sampled every 0.5 s, when there is one).
Steps 2 and 3 take items straight onto their queue (the benchmark skips the earlier steps' work).
Usage: python benchmarks/throughput.py --step 1 --server http://127.0.0.1:8000 [--items 20000]
       python benchmarks/throughput.py --step 1 --sim        # a simulated server, anywhere
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from redis import Redis

sys.path.insert(0, str(Path(__file__).parent))
from _pool import P, bodies, pool_items
from _util import table

from pool_queue.jobs.queue import screen_of
from pool_queue.observe import prefix_cache
from pool_queue.proc.procs import Procs, free_port, wait_health
from pool_queue.store.store import Store


def _plain_client(args: tuple[str, Path, int, list[dict[str, Any]], int, Any]) -> tuple[int, int, int, float, float]:
    url, root, step, items, conc, start = args
    todo = bodies(root, step, items)

    async def go() -> tuple[int, int, int, float, float]:
        ok = err = tokens = 0
        sem = asyncio.Semaphore(conc)
        limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
        async with httpx.AsyncClient(base_url=url, timeout=900, limits=limits) as c:

            async def one(b: bytes) -> None:
                nonlocal ok, err, tokens
                async with sem:
                    r = await c.post("/v1/chat/completions", content=b, headers={"Content-Type": "application/json"})
                if r.status_code == 200:
                    ok += 1
                    tokens += r.json()["usage"]["prompt_tokens"]
                else:
                    err += 1

            start.wait()  # every process has built its bodies (a barrier with the parent): start together
            t0 = time.time()
            await asyncio.gather(*(one(b) for b in todo))
            return ok, err, tokens, t0, time.time()

    return asyncio.run(go())


def ceiling(url: str, root: Path, step: int, items: list[dict[str, Any]], procs: int, conc: int) -> dict[str, float]:
    with mp.Manager() as m:
        start = m.Barrier(procs + 1)
        cut = [len(items) * i // procs for i in range(procs + 1)]  # whole videos per process, sent adjacently
        shares = [(url, root, step, items[cut[i] : cut[i + 1]], conc, start) for i in range(procs)]
        with mp.Pool(procs) as pool:
            res = pool.map_async(_plain_client, shares)
            start.wait()
            got = res.get()
    ok, err = sum(r[0] for r in got), sum(r[1] for r in got)
    wall = max(r[4] for r in got) - min(r[3] for r in got)
    return {"forwards": ok, "errors": err, "fwd_s": ok / wall, "tok_s": sum(r[2] for r in got) / wall, "wall": wall}


class GpuSampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        if not shutil.which("nvidia-smi"):
            return
        while not self.stop.is_set():
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", "0"],
                capture_output=True, text=True, check=False,
            ).stdout.strip()  # fmt: skip
            if out:
                self.samples.append((time.time(), float(out.splitlines()[0])))
            time.sleep(0.5)

    def busy(self, t0: float, t1: float) -> float | None:
        vals = [v for t, v in self.samples if t0 <= t <= t1]
        return sum(vals) / len(vals) if vals else None


def system(
    url: str,
    root: Path,
    step: int,
    items: list[dict[str, Any]],
    args: argparse.Namespace,
    procs: Procs,
    gpu: GpuSampler,
) -> dict[str, float]:
    redis_url = procs.redis(free_port(), root.parent / "redis")
    results = root / "results" / f"bench-step{step}-{int(time.time())}-{os.getpid()}"  # two benches at once: two roots
    common = ["--root", str(root), "--results", str(results), "--redis-url", redis_url]
    store = Store(results, P.fingerprint, P.model_dump(mode="json"))
    store.claim()
    screen = screen_of(store, Redis.from_url(redis_url))
    assert screen is not None
    screen.enqueue_chunks(step, [it["item_id"] for it in items], 64, videos=[it["video_id"] for it in items])
    before, tokens_before = resource.getrusage(resource.RUSAGE_CHILDREN), server_prompt_tokens(url)
    argv = [sys.executable, "-m", "workers.main", "--server", url, "--steps", str(step), "--burst"]
    argv += ["--inflight", str(args.inflight), *common]
    env = {"POOL_VIDEO_SEND": args.video_send}
    ws = [procs.start(f"bench-w{i}", [*argv, "--name", f"bench-w{i}"], env=env) for i in range(args.workers)]
    for w in ws:
        w.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rows = Store(results, P.fingerprint).winners(step)
    starts, ends = rows.column("started_at").to_pylist(), rows.column("finished_at").to_pylist()
    tokens = server_prompt_tokens(url) - tokens_before  # a batch's rows carry no per-forward count
    fwd, errors = 0, 0
    for seg in Store(results, P.fingerprint).segments(step):
        for line in seg.read_bytes().splitlines():
            r = orjson.loads(line)
            if r["status"] != "ok":
                errors += 1
                continue
            fwd += len(r["forwards"])
    t0, t1 = min(starts), max(ends)
    return {
        "items": rows.num_rows, "forwards": fwd, "errors": errors, "fwd_s": fwd / (t1 - t0),
        "tok_s": tokens / (t1 - t0), "wall": t1 - t0, "cpu_ms_per_fwd": 1000 * cpu / max(fwd, 1),
        "gpu_busy": -1.0 if (busy := gpu.busy(t0, t1)) is None else busy,
        "prefix_hit": -1.0 if (c := prefix_cache.read(results).get(step)) is None or c.rate is None else c.rate,
    }  # fmt: skip


def server_prompt_tokens(url: str) -> float:
    """The server's prompt tokens so far (its `vllm:prompt_tokens_total`), batches and single requests alike."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("vllm:prompt_tokens_total"))


def server_cache(url: str) -> tuple[float, float]:
    try:
        got = prefix_cache.parse(httpx.get(url + "/metrics", timeout=10).text)
    except httpx.HTTPError:
        got = None
    return got or (0.0, 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step", type=int, choices=(1, 2, 3), required=True)
    ap.add_argument("--server", help="a running vLLM (or simulator) base URL")
    ap.add_argument("--sim", action="store_true", help="start a simulated server with the capacity model")
    ap.add_argument("--items", type=int, default=20000, help="items the system screens (0: the plain client only)")
    ap.add_argument("--ceiling-items", type=int, default=3000, help="plain-client items (0: none)")
    ap.add_argument("--procs", type=int, default=8, help="plain-client processes")
    ap.add_argument("--conc", type=int, default=64, help="requests in flight per plain-client process")
    ap.add_argument("--workers", type=int, default=4, help="pool-worker processes")
    ap.add_argument("--inflight", type=int, default=128, help="forwards in flight per worker")
    ap.add_argument("--skip", type=int, default=0, help="leave the pool's first N items out (seen by this server)")
    ap.add_argument("--videos", type=int, help="videos in the generated pool (default: items / 2.7, as in the pool)")
    ap.add_argument("--per-video", type=int, default=0, help="exactly N items per video (1: distinct videos)")
    ap.add_argument("--real-frames", action="store_true", help="every frame a 448-px JPEG, as in the real pool")
    ap.add_argument(
        "--video-send", choices=("adjacent", "serial"), default="adjacent", help="the workers' POOL_VIDEO_SEND"
    )
    ap.add_argument("--root", type=Path, help="package root (a synthetic pool is generated if absent)")
    ap.add_argument("--out", type=Path, help="append a JSON line with the numbers and settings")
    ap.add_argument("--label", default="", help="names the server configuration in the JSON line")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="pool-bench-"))
    root = args.root or base / "root"
    n = args.skip + args.items + args.ceiling_items
    items = pool_items(root, args.step, n, args.videos, args.per_video, args.real_frames)[args.skip :]
    ceiling_items, system_items = items[: args.ceiling_items], items[args.ceiling_items :][: args.items]
    with Procs(base / "logs") as procs:
        url = args.server
        if args.sim:
            profile = "qwen3-vl-2b" if args.step == 3 else "qwen3-vl-8b"
            url = procs.sim("sim", free_port(), "--profile", profile, "--max-num-seqs", "256")
        assert url, "give --server URL or --sim"
        wait_health(url, 600)
        gpu = GpuSampler()
        gpu.start()
        ceil = None
        if ceiling_items:
            t_c, c0 = time.time(), server_cache(url)
            ceil = ceiling(url, root, args.step, ceiling_items, args.procs, args.conc)
            busy, c1 = gpu.busy(t_c, time.time()), server_cache(url)
            ceil["gpu_busy"] = -1.0 if busy is None else busy
            ceil["prefix_hit"] = (c1[1] - c0[1]) / (c1[0] - c0[0]) if c1[0] > c0[0] else -1.0
        sys_ = system(url, root, args.step, system_items, args, procs, gpu) if system_items else None
        gpu.stop.set()
    print(
        f"step {args.step} against {url}: plain client {args.procs} x {args.conc}, "
        f"system {args.workers} x {args.inflight}"
    )
    rows: list[list[object]] = []
    if ceil is not None:
        rows.append(["plain client", ceil["forwards"], ceil["errors"], ceil["wall"], ceil["fwd_s"], ceil["tok_s"],
                     ceil["gpu_busy"], ceil["prefix_hit"], "-", 100.0])  # fmt: skip
    pct = None
    if sys_ is not None:
        pct = 100 * sys_["fwd_s"] / ceil["fwd_s"] if ceil is not None else None
        rows.append(["pool-queue", sys_["forwards"], sys_["errors"], sys_["wall"], sys_["fwd_s"], sys_["tok_s"],
                     sys_["gpu_busy"], sys_["prefix_hit"], sys_["cpu_ms_per_fwd"], pct or "-"])  # fmt: skip
    print(table(["run", "forwards", "errors", "wall s", "fwd/s", "prompt tok/s", "GPU busy %", "cache hits",
                 "CPU ms/fwd", "% of ceiling"], rows))  # fmt: skip
    if args.out:
        rec = {"step": args.step, "server": url, "label": args.label, "ceiling": ceil, "system": sys_,
               "pct_of_ceiling": pct,
               "settings": {k: v for k, v in vars(args).items() if k not in ("root", "out")}}  # fmt: skip
        with args.out.open("a") as f:
            f.write(json.dumps(rec, default=str) + "\n")


if __name__ == "__main__":
    main()
