"""Requests/s of one zero-latency simulator process under step-1 load from several client processes.

Usage: python benchmarks/sim_throughput.py [--clients 2] [--seconds 8] [--inflight 32]
Prints requests/s and requests per CPU-second of the simulator (the figure that must stay well
above any client's rate, so the simulator never limits client benchmarks).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))
from _util import cpu_seconds, table

from pool_queue.proc.procs import Procs, free_port, wait_health
from pool_queue.protocol import Protocol


def client(url: str, seconds: float, inflight: int, q: mp.Queue) -> None:
    P = Protocol()
    bodies = [
        P.request_body(1, f"What does person {i} do after the door opens?", ["runs", "sits", "waves", "eats"])
        for i in range(512)
    ]

    async def run() -> int:
        n = 0
        stop = time.monotonic() + seconds
        async with aiohttp.ClientSession() as s:

            async def loop(k: int) -> None:
                nonlocal n
                while time.monotonic() < stop:
                    async with s.post(url + "/v1/chat/completions", json=bodies[(n + k) % 512]) as r:
                        await r.read()
                    n += 1

            await asyncio.gather(*(loop(k) for k in range(inflight)))
        return n

    q.put(asyncio.run(run()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--inflight", type=int, default=32)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, Procs(Path(d)) as procs:
        url = procs.sim("sim", free_port(), "--zero-latency")
        wait_health(url, 20)
        pid = procs.children["sim"].pid
        q: mp.Queue = mp.Queue()
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        ps = [mp.Process(target=client, args=(url, args.seconds, args.inflight, q)) for _ in range(args.clients)]
        for p in ps:
            p.start()
        n = sum(q.get() for _ in ps)
        for p in ps:
            p.join()
        wall, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
    print(
        table(
            ["clients", "in flight", "requests", "req/s", "sim CPU s", "req per sim CPU-s"],
            [[args.clients, args.clients * args.inflight, n, n / wall, cpu, n / cpu]],
        )
    )


if __name__ == "__main__":
    main()
