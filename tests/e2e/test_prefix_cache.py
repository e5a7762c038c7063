"""Video-grouped scheduling and vLLM's prefix-cache counters: chunks hold whole videos, a worker sends a
video's items together, and the hit rate per step reaches pool-status and the report."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pyarrow.compute as pc
import pytest
from stack import FAST, P, Stack

from pool_queue.demo.synth import SynthConfig, generate
from pool_queue.inputs.frames import frame_videos
from pool_queue.inputs.items import load_items
from pool_queue.jobs.queue import cuts
from pool_queue.observe import prefix_cache
from pool_queue.store.store import Store

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


# A step-3 server's engine as each release names it (vllm/v1/metrics/loggers.py): 0.11.0 exports the KV cache's
# use under both names and no processor-cache counters; 0.26.0 and later under one name, with them.
ENGINE_0_11 = """vllm:num_requests_running{engine="0",model_name="m"} 12.0
vllm:num_requests_waiting{engine="0",model_name="m"} 20.0
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:iteration_tokens_total_bucket{engine="0",le="16384.0",model_name="m"} 40.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 40.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 40.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 400000.0
"""
ENGINE_0_26 = ENGINE_0_11.replace("vllm:gpu_cache_usage_perc", "vllm:other") + (
    'vllm:mm_cache_queries_total{engine="0",model_name="m"} 320.0\n'
    'vllm:mm_cache_hits_total{engine="0",model_name="m"} 240.0\n'
)


def test_the_engines_view_from_each_releases_metrics():
    """Running and waiting at the read; tokens per step over the steps since the read before (none at the first
    read or after a restart); KV cache use by its newer name first; processor-cache hits where exported."""
    old, new = prefix_cache.EngineMeter(), prefix_cache.EngineMeter()
    first = old.read(prefix_cache.samples(ENGINE_0_11))
    assert first == prefix_cache.Engine(running=12, waiting=20, kv_cache_usage=0.25) == old.view
    later = ENGINE_0_11.replace("} 40.0", "} 50.0").replace("400000.0", "465536.0")
    assert old.read(prefix_cache.samples(later)) == prefix_cache.Engine(
        running=12, waiting=20, kv_cache_usage=0.25, tokens_per_step=6553.6, steps=10
    )
    restarted = old.read(prefix_cache.samples(ENGINE_0_11))  # fewer steps than at the read before
    assert restarted is not None and restarted.steps is None and restarted.tokens_per_step is None
    new.read(prefix_cache.samples(ENGINE_0_26))
    assert new.view is not None and new.view.processor_cache_hit_rate == 0.75 and new.view.kv_cache_usage == 0.25
    assert new.read({}) is None and new.view is None  # a server that exports no engine figures: nothing shown


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
@pytest.mark.slow
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


@pytest.mark.slow
def test_pool_status_shows_what_the_servers_metrics_say_about_its_engine(procs, grouped_root):
    """A simulated server that runs 4 sequences at once, its worker keeping 16 in flight: pool-status --json
    shows, from the server's own /metrics as the worker last read them, 4 requests running and the rest
    waiting, the tokens of its steps, its KV cache and processor cache; the names are vLLM's."""
    stack = Stack(grouped_root, procs)
    url = stack.sim("sim2", "qwen3-vl-2b", "--speed", "0.25", "--max-num-seqs", "4")
    items = load_items(grouped_root / "items").items.sort_by([("video_id", "ascending"), ("item_id", "ascending")])
    framed = items.filter(pc.is_in(items.column("video_id"), value_set=frame_videos(grouped_root / "frames" /
                                                                                    "pool_frames")))  # fmt: skip
    Store(stack.store.root, P.fingerprint, P.model_dump(mode="json")).claim()
    ids, videos = framed.column("item_id").to_pylist(), framed.column("video_id").to_pylist()
    stack.screen.enqueue_chunks(3, ids, 4, videos=videos)
    stack.worker("w3", url, "--steps", "3", "--inflight", "16", env=FAST)
    status = [str(Path(sys.executable).parent / "pool-status"), "--json", "--no-health", "--root", str(stack.root),
              "--redis-url", stack.redis_url]  # fmt: skip
    seen: list[dict] = []
    for _ in range(60):  # the worker reads /metrics every 5 s: a view with a step interval behind it, saturated
        st = json.loads(subprocess.run(status, capture_output=True, text=True, check=True).stdout)
        seen = st["servers"]
        e = seen[0]["engine"] if seen else None
        if e and e["steps"] and e["running"] == 4 and e["waiting"] > 0:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"no saturated engine view in pool-status: {seen}\n{stack.log('w3')}")
    assert [(v["server"], v["steps"]) for v in seen] == [(url, [3])]
    assert e["running"] <= 4  # the server's batch; its waiting ones are what the worker's bound lets in by cost
    assert 0 < e["kv_cache_usage"] <= 1 and 0 <= e["processor_cache_hit_rate"] <= 1
    assert 300 < e["tokens_per_step"] < 32 * 196 + 400  # a sibling's text up to a whole square-framed prompt
    page = httpx.get(f"{url}/metrics").text
    names = {line.split("{")[0] for line in page.splitlines()}
    histogram = {f"vllm:iteration_tokens_total_{x}" for x in ("sum", "count", "bucket")}
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", *histogram,
            "vllm:mm_cache_queries_total", "vllm:mm_cache_hits_total"} <= names  # fmt: skip
    peak = re.search(r"^pool_sim:running_peak\{[^}]*\} (\d+)$", page, re.M)  # the capacity model's own count
    assert peak is not None and e["running"] <= int(peak[1]) <= 4
