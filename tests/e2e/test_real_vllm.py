"""The client, the worker and the simulator against a REAL vLLM server (CPU build, tiny Qwen3-VL)."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import recorded
from PIL import Image
from recorded import jpeg_url, shape
from stack import Stack
from vllm_stack import P, model_snapshots, start, vllm_python, wait_ready

from pool_queue.demo.synth import SynthConfig, generate
from pool_queue.proc.procs import Procs, free_port, wait_health
from pool_queue.protocol import Protocol, image_part
from workers.client import BATCH_PATH, VLLMClient
from workers.screen import Identity, Item, Screener
from workers.slots import Slots

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """One server for the 8B name (steps 1-2) and one for the 2B name (step 3), started together."""
    py = vllm_python()
    snaps = model_snapshots(py)
    base = tmp_path_factory.mktemp("vllm")
    with Procs(base / "logs") as procs:
        urls = {s: start(procs, f"vllm-s{s}", py, snaps[s], s, base) for s in (1, 3)}

        def restart(step: int) -> None:  # the same server again, on its port
            start(procs, f"vllm-s{step}", py, snaps[step], step, base, port=int(urls[step].rsplit(":", 1)[1]))
            wait_ready(procs, f"vllm-s{step}", urls[step])

        with ThreadPoolExecutor(2) as ex:
            list(ex.map(lambda step: wait_ready(procs, f"vllm-s{step}", urls[step]), urls))
        for step, url in urls.items():  # the first request of a fresh server is slow (lazy init): not measured
            body = P.request_body(step, "Warm up?", ["yes", "no"], [jpeg_url()] if step == 3 else [])
            assert _post(url, body).status_code == 200
        yield {1: urls[1], 2: urls[1], 3: urls[3]}, procs, restart


def _post(url: str, body: dict[str, Any], path: str = "/v1/chat/completions") -> httpx.Response:
    return httpx.post(
        f"{url}{path}",
        content=orjson.dumps(body),
        headers={"Content-Type": "application/json"},
        timeout=300,
    )


def test_worker_screens_three_steps_end_to_end(servers, tmp_path, procs):
    urls, *_ = servers
    root = tmp_path / "root"
    generate(root, SynthConfig(n_items=14, n_videos=6, seed=5, frames=(20, 40), shard_videos=6))
    stack = Stack(root, procs)
    stack.enqueue(1)
    stack.worker("w8", urls[1], "--burst", "--inflight", "16")
    stack.worker("w2", urls[3], "--burst", "--inflight", "4")
    stack.wait_workers(["w8", "w2"], timeout=900)
    if stack.queued():  # a step-3 job chained after the 2B worker's queues looked empty
        stack.worker("w2-late", urls[3], "--burst", "--inflight", "4")
        stack.wait_workers(["w2-late"], timeout=900)
    counts = {}
    for step in (1, 2, 3):
        rows = stack.winners(step)
        counts[step] = len(rows)
        for r in rows.values():
            assert r["status"] == "ok", r
            assert r["model"] == P.steps[step].model and r["revision"] == P.steps[step].revision
            n = len(r["forwards"][0]["order"])
            assert r["n_perm"] == len(r["forwards"]) == P.steps[step].n_orders
            judged = []
            for f in r["forwards"]:
                assert len(f["top"]) == 20 and f["attempts"] == 1
                # a batch's usage sums its conversations: its forwards say so rather than invent a count
                assert f["prompt_tokens"] is None if f["sent"] == "batch" else f["prompt_tokens"] > 0
                top = [(t, v) for t, v in f["top"]]
                j = P.judge_forward(top, n, f["order"].index(_gold(root, r["item_id"])))
                assert math.isclose(j.margin, f["margin"]) and "ABCDEFGHIJ"[j.pred] == f["pred"]
                judged.append(j)
            assert r["removed"] == P.removed(step, judged)
            if step > 1 and r["forwards"][0]["sent"] == "single":
                per_image = (r["forwards"][0]["prompt_tokens"] - 40) / len(r["frame_indices"])
                assert per_image > 60, r["forwards"][0]["prompt_tokens"]  # images really reached the model
        if step < 3:
            survivors = [r for r in rows.values() if not r["removed"]]
            assert counts[step] >= len(survivors)
    assert counts[1] == 14 and counts[2] > 0 and counts[3] > 0
    three = next(iter(stack.winners(3).values()))
    assert len(three["frame_indices"]) == 32  # videos of 20..40 frames: 32 or all if fewer
    assert stack.raw_count(1) == 14


def _gold(root: Path, item_id: str) -> int:
    from pool_queue.inputs.items import load_items

    items = load_items(root / "items")
    return int(items.items.column("gold")[items.by_id[item_id]].as_py())


def _screen(url: str, protocol: Protocol, step: int, item: Item, frames: Path):
    return _group(url, protocol, step, [item], frames, batch=False)[0]


def _group(url: str, protocol: Protocol, step: int, items: list[Item], frames: Path, batch: bool, refs: bool = True):
    """Rows of a video's items as the worker screens them: one batch request (where the server lists the
    endpoint, with `batch`), siblings' frames by uuid alone (`refs`) or in every conversation."""

    async def go():
        client = VLLMClient(url, max_attempts=2, backoff_s=0.05)
        try:
            who = Identity(protocol.fingerprint, protocol.steps[step].model, protocol.steps[step].revision, url, "t")
            screener = Screener(protocol, client, frames, who, Slots(8))
            screener.batch = batch and await client.batch_endpoint()
            screener.refs = refs
            return await screener.screen_group(step, items), screener
        finally:
            await client.aclose()

    rows, screener = asyncio.run(go())
    assert screener.fallbacks == 0  # no batch was sent again one by one
    return rows


@pytest.fixture()
def video33(tmp_path) -> Path:
    d = tmp_path / "frames" / "v33"
    d.mkdir(parents=True)
    for i in range(33):
        Image.new("RGB", (448, 252), (i * 7, 100, 200 - i * 5)).save(d / f"frame_{i}.jpg", "JPEG", quality=90)
    return tmp_path / "frames"


def test_limits_come_back_as_permanent_error_rows(servers, video33):
    urls, *_ = servers
    item = Item("it-1", "B", "v33", "What happens in the video?", ["a dog runs", "a cat sleeps", "rain"], 1)
    ok = _screen(urls[3], P, 3, item, video33)
    assert ok.status == "ok" and len(ok.frame_indices) == 32 and ok.forwards[0].prompt_tokens > 32 * 100

    s3 = P.steps[3].model_copy(update={"n_frames": 33})
    too_many = P.model_copy(update={"steps": {**P.steps, 3: s3}})
    row = _screen(urls[3], too_many, 3, item, video33)
    assert row.status == "error" and row.error_kind == "permanent" and row.attempts == 1
    assert "At most 32 image(s) may be provided in one prompt" in (row.error or "")

    row = _screen(urls[1], P.model_copy(update={"top_logprobs": 21}), 1, item, video33)
    assert row.error_kind == "permanent" and "greater than max allowed: 20" in (row.error or "")

    long = Item("it-2", "B", "v33", "word " * 5000, ["yes", "no"], 0)
    row = _screen(urls[1], P, 1, long, video33)
    assert row.error_kind == "permanent" and "maximum context length is 4096 tokens" in (row.error or "")


DRIFT = 1e-3  # a batch runs its conversations side by side: float sums in another order, no more


def _drift(a: list[tuple[str, float]], b: list[tuple[str, float]]) -> float:
    """The largest |d logprob| over the tokens two top-20 lists share; infinite when they share fewer than 18."""
    da, db = dict(a), dict(b)
    common = da.keys() & db.keys()
    return max(abs(da[t] - db[t]) for t in common) if len(common) >= 18 else math.inf


def test_a_videos_items_in_one_batch_answer_as_each_alone(servers, video33):
    """Where the server has /v1/chat/completions/batch, a video's items go as one request and the first
    token's top-20 is what each item's own request gives, with the siblings' frames named by uuid alone
    or sent in every conversation; step 1's four orders of an item too. The numbers may move by float
    rounding only (the conversations run side by side), far less than another video's frames move them.
    A release without the endpoint (vLLM 0.11.0) gets today's requests."""
    urls, *_ = servers
    has_batch = "/v1/chat/completions/batch" in httpx.get(f"{urls[1]}/openapi.json").json()["paths"]
    other = video33 / "w33"  # the same number of frames, other pictures
    other.mkdir()
    for i in range(33):
        Image.new("RGB", (448, 252), (250 - i * 7, 20 + i * 6, 60)).save(other / f"frame_{i}.jpg", "JPEG", quality=90)
    items = [Item(f"b-{j}", "B", "v33", f"What happens in scene {j}?", ["a dog runs", "a cat sleeps", "rain"], j % 3)
             for j in range(3)]  # fmt: skip
    for step in (1, 3):
        alone = [_screen(urls[step], P, step, it, video33) for it in items]  # one request at a time
        for refs in (True, False):
            rows = _group(urls[step], P, step, items, video33, batch=True, refs=refs)
            sent = {f.sent for r in rows for f in r.forwards}
            assert sent == ({"batch"} if has_batch else {"single"}), (step, sent)
            assert all(f.prompt_tokens is None for r in rows for f in r.forwards) == has_batch
            for lone, batched in zip(alone, rows, strict=True):
                assert lone.item_id == batched.item_id and lone.status == batched.status == "ok"
                assert (lone.removed, lone.n_hits, lone.frame_indices) == (
                    batched.removed,
                    batched.n_hits,
                    batched.frame_indices,
                )
                for fa, fb in zip(lone.forwards, batched.forwards, strict=True):
                    assert fa.pred == fb.pred and _drift(fa.top, fb.top) <= DRIFT, (step, refs, lone.item_id)
    moved = _screen(urls[3], P, 3, Item("b-0", "B", "w33", items[0].question, items[0].options, 0), video33)
    assert _drift(alone[0].forwards[0].top, moved.forwards[0].top) > 100 * DRIFT  # the check sees frames


def test_simulator_answers_with_the_real_servers_structure(servers, procs, video33):
    urls, *_ = servers
    release = httpx.get(f"{urls[1]}/version").json()["version"]  # the simulator speaks as this release does
    sims = {
        1: procs.sim("sim8", free_port(), "--profile", "qwen3-vl-8b", "--max-model-len", "4096", "--vllm", release),
        3: procs.sim("sim2", free_port(), "--profile", "qwen3-vl-2b", "--max-model-len", "4096", "--vllm", release),
    }
    for u in sims.values():
        wait_health(u, 20)
    img = jpeg_url()
    q, opts = "Which one?", ["red", "green", "blue", "black"]
    cases = {
        "text": (1, P.request_body(1, q, opts, [])),
        "one image": (1, P.request_body(2, q, opts, [img])),
        "33 images": (3, P.request_body(3, q, opts, [img] * 33)),
        "top_logprobs 21": (1, {**P.request_body(1, q, opts, []), "top_logprobs": 21}),
        "too long": (1, P.request_body(1, "word " * 5000, opts, [])),
        "unknown model": (1, {**P.request_body(1, q, opts, []), "model": "nope"}),
    }
    for name, (step, body) in cases.items():
        real, sim = _post(urls[step], body), _post(sims[step], body)
        assert real.status_code == sim.status_code, (name, real.text, sim.text)
        assert shape(real.json()) == shape(sim.json()), name
        if real.status_code != 200:  # same text (the token count of an over-long prompt is the sim's estimate)
            cut = 60 if name == "too long" else None
            assert real.json()["error"]["message"][:cut] == sim.json()["error"]["message"][:cut], name
    # the batch endpoint (vLLM >= 0.22; 0.11.0 answers 404): a batch's shape, and a uuid no cache holds
    two = P.batch_body(1, [P.messages(q, o, []) for o in (opts, opts[::-1])])
    unknown = P.batch_body(3, [P.messages(q, opts, [image_part("", "f" * 32)])])
    for name, (step, body) in {"batch": (1, two), "uuid not cached": (3, unknown)}.items():
        real, sim = _post(urls[step], body, BATCH_PATH), _post(sims[step], body, BATCH_PATH)
        assert real.status_code == sim.status_code, (name, real.text, sim.text)
        assert shape(real.json()) == shape(sim.json()), name
        if real.status_code != 200:
            assert (real.json().get("error") or real.json()) == (sim.json().get("error") or sim.json()), name
    listed = {u: BATCH_PATH in httpx.get(f"{u}/openapi.json").json()["paths"] for u in (urls[1], sims[1])}
    assert len(set(listed.values())) == 1, listed
    bare = orjson.dumps(cases["text"][1])  # no Content-Type header: vLLM refuses it
    real = httpx.post(f"{urls[1]}/v1/chat/completions", content=bare)
    sim = httpx.post(f"{sims[1]}/v1/chat/completions", content=bare)
    assert real.status_code == sim.status_code == 400 and real.json() == sim.json()
    for step in (1, 3):
        real_m = httpx.get(f"{urls[step]}/v1/models").json()
        sim_m = httpx.get(f"{sims[step]}/v1/models").json()
        assert shape(real_m) == shape(sim_m)
        assert real_m["data"][0]["id"] == sim_m["data"][0]["id"]
        assert real_m["data"][0]["root"].endswith(sim_m["data"][0]["root"].split("/snapshots/")[-1])


def test_recorded_responses_still_match_the_server(servers):
    """The repo keeps one real response per step; the live server must still answer in that shape.

    POOL_RECORD=1 rewrites them from this server (after a vLLM upgrade)."""
    urls, *_ = servers
    version = httpx.get(f"{urls[1]}/version").json()["version"]
    for step in (1, 2, 3):
        live = _post(urls[step], recorded.request(step))
        assert live.status_code == 200, live.text
        if os.environ.get("POOL_RECORD") == "1":
            recorded.save(step, version, live.json())
        rec = recorded.load(step, version)
        assert shape(live.json()) == shape(rec["response"]), f"step {step}: vLLM {version} vs {rec['vllm_version']}"
        assert live.json()["usage"]["prompt_tokens"] == rec["response"]["usage"]["prompt_tokens"]


def test_a_server_killed_mid_run_and_restarted_charges_no_item(servers, tmp_path, procs):
    """The failure drill of a multi-GPU screen, on the CPU: the real 8B server is SIGKILLed (its whole
    process group) while a worker screens, then started again on its port; the worker waits out the
    outage and every item ends with one ok row."""
    urls, vllm_procs, restart = servers
    root = tmp_path / "root"
    generate(root, SynthConfig(n_items=150, n_videos=20, seed=9, frames=(8, 9), shard_videos=20))
    stack = Stack(root, procs)
    stack.enqueue(1, chunk_size=8)
    w = stack.worker("w", urls[1], "--burst", "--inflight", "8", "--steps", "1")
    deadline = time.monotonic() + 300
    while stack.raw_count(1) < 10:
        assert time.monotonic() < deadline, stack.log("w")
        time.sleep(0.2)
    # the worker is held still while its server dies, so the kill lands mid-run however busy the machine is
    w.send_signal(signal.SIGSTOP)
    killed_at = stack.raw_count(1)
    vllm_procs.stop("vllm-s1", signal.SIGKILL)
    w.send_signal(signal.SIGCONT)  # its in-flight requests find the server gone
    restart(1)
    stack.wait_workers(["w"], timeout=900)
    log = stack.log("w", tail=100_000)
    assert "is down (/health fails): waiting for it" in log and " is back after " in log
    rows = stack.winners(1)
    assert killed_at < 150 and len(rows) == 150 == stack.raw_count(1)  # none lost, none repeated
    assert all(r["status"] == "ok" and r["n_perm"] == 4 for r in rows.values())
