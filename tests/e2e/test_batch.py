"""The workers' batch path against the simulator's /v1/chat/completions/batch: a video's items as one request,
and what happens when a batch fails (one bad item, a cache that lost or never held a frame, a server whose
cache and engine disagree): each item still gets its own row, as one request per forward would give it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from PIL import Image

from pool_queue.proc.procs import Procs, free_port, wait_health
from pool_queue.protocol import Protocol
from pool_queue.rows import Row
from workers.client import VLLMClient
from workers.screen import MISS_STREAK, Identity, Item, Screener
from workers.slots import Slots

pytestmark = pytest.mark.slow  # simulators and worker processes

P = Protocol()
OPTIONS = ["a dog runs", "a cat sleeps", "it rains", "a car stops"]


@pytest.fixture()
def frames(tmp_path: Path) -> Path:
    """Videos v0..v5 of 40 frames each, every video its own pictures."""
    for v in range(6):
        d = tmp_path / "frames" / f"v{v}"
        d.mkdir(parents=True)
        for i in range(40):
            Image.new("RGB", (448, 252), (v * 40, i * 6, 90)).save(d / f"frame_{i:03d}.jpg", "JPEG", quality=90)
    return tmp_path / "frames"


def items(video: str, n: int = 3, long: int | None = None) -> list[Item]:
    return [Item(f"{video}-{j}", "B", video, "word " * 9000 if j == long else f"What happens {j}?", OPTIONS, j % 4)
            for j in range(n)]  # fmt: skip


def sim(procs: Procs, *args: str, profile: str = "qwen3-vl-2b") -> str:
    url = procs.sim(f"sim-{len(procs.children)}", free_port(), "--profile", profile, "--zero-latency", *args)
    wait_health(url, 20)
    return url


def screen(url: str, frames: Path, groups: list[list[Item]], step: int = 3, batch: bool = True):
    """The groups one after another through one screener, as a worker's job sends them."""

    async def go() -> tuple[list[list[Row]], Screener]:
        async with VLLMClient(url, max_attempts=2, backoff_s=0.01) as client:
            spec = P.steps[step]
            screener = Screener(
                P, client, frames, Identity(P.fingerprint, spec.model, spec.revision, url, "t"), Slots(16)
            )
            screener.batch = batch and await client.batch_endpoint()
            return [await screener.screen_group(step, g) for g in groups], screener

    return asyncio.run(go())


def sent(rows: list[Row]) -> set[str]:
    return {f.sent for r in rows for f in r.forwards}


def tops(rows: list[Row]) -> list[list[list[tuple[str, float]]]]:
    return [[f.top for f in r.forwards] for r in rows]


def test_a_videos_items_go_as_one_batch_with_the_answers_of_each_alone(procs, frames):
    url = sim(procs)
    (alone,), _ = screen(url, frames, [items("v0")], batch=False)
    (batched,), screener = screen(url, frames, [items("v0")])
    assert sent(alone) == {"single"} and sent(batched) == {"batch"} and screener.fallbacks == 0
    assert tops(alone) == tops(batched) and [r.removed for r in alone] == [r.removed for r in batched]
    assert all(f.prompt_tokens is None for r in batched for f in r.forwards)  # the batch's usage sums them
    assert screener.tokens[3] > 3 * 32 * 100  # ...and the prefix-cache meter gets the sum
    metrics = httpx.get(f"{url}/metrics").text
    hits = next(float(x.split()[-1]) for x in metrics.splitlines() if x.startswith("vllm:mm_cache_hits_total"))
    assert hits >= 2 * 32  # the siblings' frames came from the server's processor cache
    (one,), _ = screen(url, frames, [items("v1", n=1)])  # a lone item: its own request, as before
    assert sent(one) == {"single"}
    (orders,), _ = screen(sim(procs, profile="qwen3-vl-8b"), frames, [items("v2", n=1)], step=1)  # 4 orders, 1 batch
    assert sent(orders) == {"batch"} and len(orders[0].forwards) == 4


def test_one_refused_item_of_a_batch_costs_its_siblings_nothing(procs, frames):
    url = sim(procs)
    (rows,), screener = screen(url, frames, [items("v0", long=1)])
    assert [r.status for r in rows] == ["ok", "error", "ok"]
    assert rows[1].error_kind == "permanent" and "maximum context length" in (rows[1].error or "")
    assert screener.fallbacks == 1 and sent([rows[0], rows[2]]) == {"single"}  # sent again one by one
    (alone,), _ = screen(url, frames, [[rows_item for rows_item in items("v0") if rows_item.item_id != "v0-1"]])
    assert tops([rows[0], rows[2]]) == tops(alone)  # the same answers as the siblings' own batch


def test_a_cache_that_never_holds_a_frame_costs_no_item_and_batches_carry_frames_after_a_streak(procs, frames):
    url = sim(procs, "--mm-processor-cache-gb", "0")  # a server started without the processor cache
    groups = [items(f"v{v}") for v in range(MISS_STREAK + 1)]
    out, screener = screen(url, frames, groups)
    assert all(r.status == "ok" for rows in out for r in rows)
    assert screener.fallbacks == MISS_STREAK and not screener.refs  # then every conversation carries the frames
    assert [sent(rows) for rows in out] == [{"single"}] * MISS_STREAK + [{"batch"}]
    (want,), _ = screen(url, frames, [groups[-1]], batch=False)
    assert tops(out[-1]) == tops(want)


def test_a_cache_lost_between_requests_or_out_of_step_with_the_engine_charges_no_item(procs, frames):
    url = sim(procs, "--fault-schedule", "3:stale")  # vLLM's 500 "Expected a cached item" on the third request
    (first, second, third), screener = screen(url, frames, [items("v0"), items("v1"), items("v2")])
    assert screener.fallbacks == 1 and [sent(first), sent(second), sent(third)] == [{"batch"}, {"batch"}, {"single"}]
    assert all(r.status == "ok" for r in first + second + third)
    httpx.post(f"{url}/_sim/mode", json={"reset_mm_cache": True}).raise_for_status()  # as a restart empties it
    (again,), screener = screen(url, frames, [items("v0")])  # each batch's first conversation carries the frames
    assert screener.fallbacks == 0 and sent(again) == {"batch"} and tops(again) == tops(first)


def test_batches_of_several_videos_share_the_bound_by_what_they_cost_the_server(procs, frames):
    """Four videos' batches of four, under a bound of four forwards in flight, as a job sends them (side by side).
    Each costs the server its first frames and its siblings' text (~1.1 forwards), so the four go in together:
    the server runs more conversations at once than the bound (its own peak count, not a clock), and one
    batch's siblings never keep another video's first frames waiting. Counted as four forwards each, they
    would go one batch at a time, the server never running more than four. Each prefill takes ~2.3 s
    (--speed 4), far longer than preparing the four videos' frames."""
    url = procs.sim(f"sim-{len(procs.children)}", free_port(), "--profile", "qwen3-vl-2b", "--speed", "4")
    wait_health(url, 20)
    groups = [items(f"v{v}", n=4) for v in range(4)]

    async def go() -> list[list[Row]]:
        async with VLLMClient(url, max_attempts=2, backoff_s=0.01) as client:
            spec = P.steps[3]
            screener = Screener(
                P, client, frames, Identity(P.fingerprint, spec.model, spec.revision, url, "t"), Slots(4)
            )
            screener.batch = await client.batch_endpoint()
            return list(await asyncio.gather(*(screener.screen_group(3, g) for g in groups)))

    out = asyncio.run(go())
    assert all(r.status == "ok" for rows in out for r in rows) and [sent(rows) for rows in out] == [{"batch"}] * 4
    peak = next(float(x.split()[-1]) for x in httpx.get(f"{url}/metrics").text.splitlines()
                if x.startswith("pool_sim:running_peak"))  # fmt: skip
    assert peak > 4
