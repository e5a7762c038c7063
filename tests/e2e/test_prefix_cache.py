"""Video-grouped scheduling and vLLM's prefix-cache counters: chunks hold whole videos, a worker sends a
video's items together, and the hit rate per step reaches pool-status and the report."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest
from stack import P, Stack

from pool_queue import prefix_cache
from pool_queue.frames import frame_videos
from pool_queue.items import load_items
from pool_queue.queue import cuts
from pool_queue.store import Store
from pool_queue.synth import SynthConfig, generate

VLLM_METRICS = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-VL-2B-Instruct"} 1200.0
vllm:prefix_cache_queries_total{engine="1",model_name="Qwen/Qwen3-VL-2B-Instruct"} 300.0
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-VL-2B-Instruct"} 900.0
vllm:prefix_cache_hits_created 1.7e9
"""


def test_counters_parse_and_charge_the_steps_that_caused_them(tmp_path):
    assert prefix_cache.parse(VLLM_METRICS) == (1500.0, 900.0)  # summed over engines; _created is not a count
    assert prefix_cache.parse("vllm:num_requests_running 3\n") is None  # an older vLLM: nothing to show
    m = prefix_cache.Meter.for_worker(tmp_path, "w1", "http://s")
    m.charge((100.0, 10.0), {2: 50})  # the first read is the baseline
    assert prefix_cache.read(tmp_path) == {}
    m.charge((1100.0, 610.0), {2: 250, 3: 750})  # 1,000 queries, 600 hits, split by prompt tokens
    m.charge((50.0, 0.0), {3: 10})  # the server restarted: a new baseline, nothing charged
    m.charge((150.0, 90.0), {3: 100})
    got = prefix_cache.read(tmp_path)
    assert got[2].queries == pytest.approx(250) and got[2].hits == pytest.approx(150)
    assert got[3].queries == pytest.approx(850) and got[3].rate == pytest.approx((450 + 90) / 850)
    (tmp_path / prefix_cache.DIR / "torn.json").write_text("{")  # a half-written file is left out
    assert prefix_cache.read(tmp_path)[3].hits == pytest.approx(540)


def test_cuts_never_split_a_video():
    videos = ["a", "a", "a", "b", "b", "c", "d", "d", "d", "d"]
    assert cuts(10, 4, videos) == [(0, 5), (5, 10)]  # each cut moved to its video's end
    assert cuts(3, 1, ["a", "b", "c"]) == [(0, 1), (1, 2), (2, 3)]
    assert cuts(20, 4, ["long"] * 19 + ["x"]) == [(0, 8), (8, 16), (16, 20)]  # a huge video: cut at 2 x size
    assert cuts(10, 4) == [(0, 4), (4, 8), (8, 10)]  # without videos: plain chunks


@pytest.fixture()
def grouped_root(tmp_path: Path) -> Path:
    root = tmp_path / "pool"
    generate(root, SynthConfig(n_items=360, n_videos=120, items_per_video=3, k_fraction=0.0, missing_fraction=0.0))
    return root


@pytest.mark.parametrize(("send", "grouped"), [("adjacent", True), ("serial", True), ("adjacent", False)])
def test_three_items_per_video_hit_the_prefix_cache(procs, grouped_root, tmp_path, send, grouped):
    """Step 3 (32 frames) on a pool of 3 items per video, chunks of 4 items, a server cache of ~10 prompts:
    grouped by video, the hit rate nears the ideal 2/3 of the tokens; in random order the cache forgets."""
    stack = Stack(grouped_root, procs)
    url = stack.sim("sim2", "qwen3-vl-2b", "--speed", "50", "--prefix-cache-tokens", "40000")
    items = load_items(grouped_root / "items").items.sort_by([("video_id", "ascending"), ("item_id", "ascending")])
    framed = pc.is_in(items.column("video_id"), value_set=frame_videos(grouped_root / "frames" / "pool_frames"))
    with_frames = items.filter(framed)
    if not grouped:
        with_frames = with_frames.take(random.Random(0).sample(range(with_frames.num_rows), with_frames.num_rows))
    Store(stack.store.root, P.fingerprint, P.model_dump(mode="json")).claim()
    ids, videos = with_frames.column("item_id").to_pylist(), with_frames.column("video_id").to_pylist()
    stack.screen.enqueue_chunks(3, ids, 4, videos=videos if grouped else None)
    stack.worker("w2", url, "--burst", "--steps", "3", env={"POOL_VIDEO_SEND": send})
    stack.wait_workers(["w2"])
    assert stack.raw_count(3) == len(ids)
    rate = prefix_cache.read(stack.store.root)[3].rate
    assert rate is not None and (rate >= 0.6 if grouped else rate < 0.3), rate
    out = subprocess.run(
        [str(Path(sys.executable).parent / "pool-status"), "--json", "--no-health", "--root", str(stack.root),
         "--redis-url", stack.redis_url],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    st = {s["step"]: s for s in json.loads(out.stdout)["steps"]}
    assert st[3]["prefix_cache_hit_rate"] == pytest.approx(rate)
