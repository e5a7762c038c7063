"""CPU per forward of each way to send one step-1 request, in one process, alternating, against a
zero-latency simulator: which httpx path the worker uses, and how far it is from aiohttp itself.

    python benchmarks/http_paths.py [--requests 3000] [--inflight 64] [--rounds 3]

Paths: httpx.AsyncClient over httpx-aiohttp's transport (the worker before), that transport called
directly with a request built from parts made once, workers.transport.SlimTransport the same way,
the worker's own path (workers.client), and a bare aiohttp session (the floor). Each parses the
top-20 list the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport

sys.path.insert(0, str(Path(__file__).parent))
from _pool import P
from _util import table

from pool_queue.proc.procs import Procs, free_port, wait_health
from workers.client import VLLMClient, parse_answer
from workers.transport import SlimTransport

Send = Callable[[bytes], Awaitable[object]]


def body() -> bytes:
    return orjson.dumps(P.request_body(1, "What happens next?", ["a", "b", "c", "d"], []))


async def run(send: Send, raw: bytes, n: int, inflight: int) -> float:
    """CPU seconds of this process per request."""
    sem = asyncio.Semaphore(inflight)

    async def one() -> None:
        async with sem:
            await send(raw)

    await asyncio.gather(*(one() for _ in range(200)))  # warm connections
    t0 = time.process_time()
    await asyncio.gather(*(one() for _ in range(n)))
    return (time.process_time() - t0) / n


async def main_async(url: str, n: int, inflight: int, rounds: int) -> list[list[object]]:
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    client = httpx.AsyncClient(base_url=url, transport=AiohttpTransport(limits=limits), timeout=120)
    transport = AiohttpTransport(limits=limits)
    target = httpx.URL(url + "/v1/chat/completions")
    headers = httpx.Headers({"Content-Type": "application/json"})
    ext = {"timeout": {"connect": 10.0, "read": 120.0, "write": 120.0, "pool": 120.0}}
    worker = VLLMClient(url)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256), cookie_jar=aiohttp.DummyCookieJar())

    async def via_client(raw: bytes) -> object:
        r = await client.post("/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"})
        return parse_answer(r.content)

    async def via_transport(raw: bytes) -> object:
        req = httpx.Request("POST", target, headers=headers, content=raw, extensions=ext)
        r = await transport.handle_async_request(req)
        try:
            return parse_answer(await r.aread())
        finally:
            await r.aclose()

    slim = SlimTransport(256, 120.0)

    async def via_slim(raw: bytes) -> object:
        req = httpx.Request("POST", target, headers=headers, content=raw)
        return parse_answer((await slim.handle_async_request(req)).content)

    async def via_worker(raw: bytes) -> object:
        return await worker.forward(raw)

    async def via_aiohttp(raw: bytes) -> object:
        json_type = {"Content-Type": "application/json"}
        async with session.post(url + "/v1/chat/completions", data=raw, headers=json_type) as r:
            return parse_answer(await r.read())

    paths = {
        "httpx.AsyncClient + aiohttp transport": via_client,
        "aiohttp transport, request from parts": via_transport,
        "SlimTransport, request from parts": via_slim,
        "pool-worker's client (workers.client)": via_worker,
        "aiohttp directly (floor)": via_aiohttp,
    }
    raw = body()
    got: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(rounds):
        for name, send in paths.items():
            got[name].append(await run(send, raw, n, inflight))
    await client.aclose()
    await transport.aclose()
    await worker.aclose()
    await slim.aclose()
    await session.close()
    floor = statistics.median(got["aiohttp directly (floor)"])
    return [[k, f"{1000 * statistics.median(v):.3f}", f"{statistics.median(v) / floor:.2f}"] for k, v in got.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--inflight", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with Procs(Path("/tmp") / f"http-paths-{free_port()}") as procs:
        url = procs.sim("sim", free_port(), "--zero-latency")
        wait_health(url, 20)
        if len(os.sched_getaffinity(0)) > 1:  # the client on one core, the server on another
            os.sched_setaffinity(procs.children["sim"].pid, {max(os.sched_getaffinity(0))})
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        rows = asyncio.run(main_async(url, args.requests, args.inflight, args.rounds))
    print(
        f"{args.requests} step-1 forwards per path and round, {args.inflight} in flight, median of {args.rounds} rounds"
    )
    print(table(["path", "CPU ms per forward", "x aiohttp"], rows))


if __name__ == "__main__":
    main()
