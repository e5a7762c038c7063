"""Worker cost and occupancy, with a real pool-worker process, Redis and simulator.

1. Client overhead: step-1 forwards/s and CPU ms per forward of a pool-worker process against a
   zero-latency simulator, over a steady window after start-up (goal <= 0.5 ms, >= 2,000/s), next to
   the run package's seed-style client (32 threads, sync httpx) in the same run, alternating.
2. Occupancy: against the capacity-model simulator, mean requests running at the server over
   max-num-seqs in steady state (goal >= 95 %).
3. Step-3 request build (32 frames): CPU ms per item, pass-through frames vs frames needing a resize.
Usage: python benchmarks/client_overhead.py [--items 6000] [--window 6] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
from _util import cpu_seconds, table

from pool_queue.commands import enqueue
from pool_queue.demo.synth import SynthConfig, generate
from pool_queue.inputs.frames import FrameEncoder, list_frames
from pool_queue.proc.procs import Procs, free_port, wait_health


def sim_counter(url: str, name: str) -> float:
    m = re.search(rf"{name}\S* (\S+)", httpx.get(url + "/metrics").text)
    return float(m.group(1)) if m else 0.0


def steady(pid: int, url: str, warm_s: float, window_s: float) -> tuple[float, float, float]:
    """(forwards, CPU s of the process, seconds the server was busy) over one window after warm-up."""
    time.sleep(warm_s)
    fw0, cpu0, run0 = sim_counter(url, "request_success_total"), cpu_seconds(pid), sim_counter(url, "running_seconds")
    time.sleep(window_s)
    fw1, cpu1, run1 = sim_counter(url, "request_success_total"), cpu_seconds(pid), sim_counter(url, "running_seconds")
    return fw1 - fw0, cpu1 - cpu0, run1 - run0


def run_worker(procs: Procs, root: Path, redis_url: str, url: str, name: str, window_s: float) -> dict[str, float]:
    results = root / "results" / f"{name}-{time.monotonic_ns()}"
    common = ["--root", str(root), "--results", str(results), "--redis-url", redis_url]
    enqueue.main(["--step", "1", *common])
    argv = [sys.executable, "-m", "workers.main", "--server", url, "--steps", "1", "--burst", "--inflight", "64"]
    w = procs.start(name, [*argv, *common])
    fw, cpu, busy = steady(w.pid, url, 4.0, window_s)  # past start-up (imports, item table)
    w.send_signal(signal.SIGTERM)
    w.wait(120)
    return {"fw_s": fw / window_s, "ms": 1000 * cpu / max(1.0, fw), "occupancy": busy / window_s}


def seed_client(url: str, root: Path, seconds: float, threads: int = 32) -> None:
    """The run package's way: threads, each with a sync httpx client, per item 4 forwards one after the
    other, judged, one JSON line appended. Prints forwards and CPU over the run (started by run_seed)."""
    import json
    import threading

    from pool_queue.inputs.items import load_items
    from pool_queue.protocol import Protocol
    from workers.client import parse_answer

    proto = Protocol()
    items = load_items(root / "items").items.to_pylist()
    out = open(root / f"seed-{os.getpid()}.jsonl", "a")  # noqa: SIM115
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    count = [0]

    def loop(k: int) -> None:
        with httpx.Client(base_url=url, timeout=120) as http:
            i = k
            while time.monotonic() < stop:
                it = items[i % len(items)]
                fws = []
                for order in proto.orders(1, it["item_id"], it["n_options"]):
                    body = proto.request_body(1, it["question"], [it["options"][j] for j in order], [])
                    top, _ = parse_answer(http.post("/v1/chat/completions", json=body).content)
                    fws.append(proto.judge_forward(top, it["n_options"], order.index(it["gold"])))
                row = {"item_id": it["item_id"], "removed": proto.removed(1, fws), "margins": [f.margin for f in fws]}
                with lock:
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    count[0] += len(fws)
                i += threads

    ts = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(count[0])


def run_seed(procs: Procs, root: Path, url: str, name: str, window_s: float) -> dict[str, float]:
    argv = [sys.executable, __file__, "--seed-client", url, "--root", str(root), "--seconds", str(window_s + 8)]
    p = procs.start(name, argv)
    fw, cpu, busy = steady(p.pid, url, 4.0, window_s)
    p.wait(120)
    return {"fw_s": fw / window_s, "ms": 1000 * cpu / max(1.0, fw), "occupancy": busy / window_s}


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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=6000)
    ap.add_argument("--window", type=float, default=6.0, help="seconds of the steady window")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed-client", metavar="URL", help=argparse.SUPPRESS)
    ap.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.seed_client:
        seed_client(args.seed_client, args.root, args.seconds)
        return
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "root"
        generate(root, SynthConfig(n_items=args.items, n_videos=60, frames=(32, 64)))
        rows: list[list[object]] = []
        with Procs(Path(d) / "logs") as procs:
            redis_url = procs.redis(free_port(), Path(d) / "redis")
            zero = procs.sim("sim-zero", free_port(), "--zero-latency")
            cap = procs.sim("sim-cap", free_port(), "--max-num-seqs", "32", "--speed", "0.5")
            for u in (zero, cap):
                wait_health(u, 20)
            got: dict[str, list[dict[str, float]]] = {"pool-worker": [], "seed-style (32 threads, sync httpx)": []}
            for r in range(args.rounds):  # alternating, so both see the same machine
                got["pool-worker"].append(run_worker(procs, root, redis_url, zero, f"worker-{r}", args.window))
                got["seed-style (32 threads, sync httpx)"].append(run_seed(procs, root, zero, f"seed-{r}", args.window))
            occ = run_worker(procs, root, redis_url, cap, "worker-capacity", args.window)["occupancy"]
        for name, runs in got.items():
            ms = statistics.median(x["ms"] for x in runs)
            rows.append([name, f"{statistics.median(x['fw_s'] for x in runs):,.0f}", f"{ms:.3f}"])
        ratio = float(rows[1][2]) / float(rows[0][2])
        print(
            f"zero-latency simulator, steady {args.window:.0f} s windows after 4 s of start-up, median of {args.rounds}"
        )
        print(table(["client", "forwards/s", "CPU ms per forward"], rows))
        print(f"seed-style CPU per forward / pool-worker's: {ratio:.2f}x")
        print(f"occupancy against the capacity model (32 seqs): {occ / 32:.0%} of max-num-seqs busy")
        print()
        print(table(["step-3 build, 32 frames", "items", "CPU ms per item"], build_cost(root)))


if __name__ == "__main__":
    main()
