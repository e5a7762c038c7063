"""Worker cost and occupancy, with a real pool-worker process, Redis and simulator.

1. Client overhead: step-1 forwards/s and worker CPU ms per forward against a zero-latency
   simulator (goal >= 2,000 forwards/s per worker process, <= 0.5 ms CPU per forward).
2. Occupancy: against the capacity-model simulator, mean requests running at the server over
   max-num-seqs in steady state (goal >= 95 %).
3. Step-3 request build (32 frames): CPU ms per item, pass-through frames vs frames needing a resize.
Usage: python benchmarks/client_overhead.py [--items 3000]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import httpx
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
from _util import cpu_seconds, table

from pool_queue.commands import enqueue
from pool_queue.frames import FrameEncoder, list_frames
from pool_queue.procs import Procs, free_port, wait_health
from pool_queue.synth import SynthConfig, generate


def sim_running_seconds(url: str) -> float:
    m = re.search(r"pool_sim:running_seconds_total\S* (\S+)", httpx.get(url + "/metrics").text)
    return float(m.group(1)) if m else 0.0


def run_worker(procs: Procs, root: Path, redis_url: str, sim_args: list[str], inflight: int, name: str) -> list[object]:
    url = procs.sim(f"sim-{name}", free_port(), *sim_args)
    wait_health(url, 20)
    results = root / "results" / name
    common = ["--root", str(root), "--results", str(results), "--redis-url", redis_url]
    enqueue.main(["--step", "1", *common])
    t0 = time.perf_counter()
    w = procs.start(
        name,
        [
            sys.executable,
            "-m",
            "workers.main",
            "--server",
            url,
            "--steps",
            "1",
            "--burst",
            "--inflight",
            str(inflight),
            *common,
        ],
    )
    time.sleep(3.0)  # past start-up (imports, item table): measure the steady state only
    cpu0, run0, wall0 = cpu_seconds(w.pid), sim_running_seconds(url), time.perf_counter()
    time.sleep(6.0)
    cpu1, run1, wall1 = cpu_seconds(w.pid), sim_running_seconds(url), time.perf_counter()
    fw0 = int(re.search(r"request_success_total\S* (\d+)", httpx.get(url + "/metrics").text).group(1))  # type: ignore[union-attr]
    w.wait(600)
    total_wall = time.perf_counter() - t0
    fw = int(re.search(r"request_success_total\S* (\d+)", httpx.get(url + "/metrics").text).group(1))  # type: ignore[union-attr]
    steady = (fw0 - 0) / (wall1 - t0)
    occ = (run1 - run0) / (wall1 - wall0)
    return [
        name,
        inflight,
        fw,
        f"{fw / total_wall:,.0f}",
        f"{steady:,.0f}",
        f"{1000 * (cpu1 - cpu0) / max(1, fw0 * (wall1 - wall0) / (wall1 - t0)):.2f}",
        f"{occ:.1f}",
    ]


def _is_448_jpeg(path: Path) -> bool:
    with Image.open(path) as im:
        return im.format == "JPEG" and max(im.size) == 448


def build_cost(root: Path) -> list[list[object]]:
    frames = root / "frames" / "pool_frames"
    vids = [d for d in sorted(frames.iterdir()) if d.is_dir() and len(list_frames(d)) >= 32]
    rows: list[list[object]] = []
    for kind, want in (("pass-through (448-px JPEG)", True), ("resize (854x480 JPEG / 640x360 PNG)", False)):
        chosen = [d for d in vids if _is_448_jpeg(list_frames(d)[0]) == want][:10]
        enc = FrameEncoder(cache_size=0)
        t0 = time.process_time()
        for d in chosen:
            fs = list_frames(d)
            for i in range(32):
                enc.data_url(fs[round(i * (len(fs) - 1) / 31)])
        if chosen:
            rows.append([kind, len(chosen), f"{1000 * (time.process_time() - t0) / len(chosen):.1f}"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--items", type=int, default=3000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "root"
        generate(root, SynthConfig(n_items=a.items, n_videos=60, frames=(32, 64)))
        with Procs(Path(d) / "logs") as procs:
            redis_url = procs.redis(free_port(), Path(d) / "redis")
            rows = [
                run_worker(procs, root, redis_url, ["--zero-latency"], 64, "zero-latency"),
                run_worker(procs, root, redis_url, ["--max-num-seqs", "32", "--speed", "0.5"], 64, "capacity-32-seqs"),
            ]
        print(
            table(
                [
                    "simulator",
                    "in flight",
                    "forwards",
                    "fwd/s (whole run)",
                    "fwd/s (steady)",
                    "worker CPU ms/fwd",
                    "mean running at server (of max-num-seqs)",
                ],
                rows,
            )
        )
        print()
        print(table(["step-3 build, 32 frames", "items", "CPU ms per item"], build_cost(root)))


if __name__ == "__main__":
    main()
