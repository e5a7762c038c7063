"""A vLLM-compatible OpenAI server with a simulated model (aiohttp; orjson on the hot path).

Answers our requests the way vLLM does (shape, validation, errors, /health, /v1/models,
/metrics) with a capacity model: at most `max_num_seqs` requests run at once, each for a time
proportional to its prompt tokens, the rest wait, as on a GPU. Zero-latency mode skips the
capacity model so client overhead can be measured alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from ..protocol import BATCH_PATH as BATCH
from .checks import Limits, Parsed, SimError, check, check_batch
from .dialects import Dialect, dialect
from .faults import FaultPlan
from .mmcache import ProcessorCache
from .model import Profile, answer

CHAT = "/v1/chat/completions"
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)  # vLLM's, for iteration tokens


@dataclass
class SimConfig:
    profile: Profile
    served_name: str
    max_num_seqs: int = 64
    max_logprobs: int = 20
    max_images: int = 32
    max_model_len: int | None = None
    api_key: str | None = None
    warmup_s: float = 0.0
    zero_latency: bool = False
    speed: float = 1.0  # >1 runs the capacity model faster than the profile says
    prefix_cache_tokens: int = 1_000_000  # a 2B's KV cache near 0.85 of an H200 (32 GiB held 299,584 tokens)
    mm_processor_cache_gb: float = 4.0  # vLLM's default; 0 turns the processor cache off
    old_errors: bool = False
    dialect: Dialect = field(default_factory=dialect)  # the release whose fields and error texts it gives
    exit_after: int | None = None
    hang_s: float = 3600.0
    faults: FaultPlan = field(default_factory=FaultPlan)


@dataclass
class Stats:
    running: int = 0
    waiting: int = 0
    prompt_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    success: int = 0
    requests: int = 0
    running_s: float = 0.0  # integral of `running` over time: mean occupancy = d(this)/dt
    peak_running: int = 0  # the capacity model's own counts: a test checks them, not a wall-clock rate
    peak_waiting: int = 0
    # vLLM's `vllm:iteration_tokens_total` histogram. The capacity model runs sequences side by side, not in
    # engine iterations: each request's uncached prompt counts as one iteration of its own (max_tokens 1: no
    # decode iteration). An iteration here is the engine's; a `step` elsewhere is one of the protocol's.
    iterations: int = 0
    iteration_tokens: int = 0
    iteration_buckets: list[int] = field(default_factory=lambda: [0] * len(ITERATION_BUCKETS))
    _mark: float = field(default_factory=time.monotonic)

    def iteration(self, tokens: int) -> None:
        self.iterations += 1
        self.iteration_tokens += tokens
        for i, le in enumerate(ITERATION_BUCKETS):
            self.iteration_buckets[i] += tokens <= le

    def tick(self) -> None:
        now = time.monotonic()
        self.running_s += self.running * (now - self._mark)
        self._mark = now


def snapshot_path(model: str, revision: str) -> str:
    """Where huggingface_hub keeps a pinned snapshot; vLLM reports it as the model's root."""
    return f"/root/.cache/huggingface/hub/models--{model.replace('/', '--')}/snapshots/{revision}"


class SimServer:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.limits = Limits(
            cfg.served_name,
            cfg.max_logprobs,
            cfg.max_images,
            cfg.max_model_len or cfg.profile.max_model_len,
            cfg.dialect,
        )
        self.stats = Stats()
        self.started = time.time()
        self.created = int(self.started)
        self.engine_dead = False
        self._slots = asyncio.Semaphore(cfg.max_num_seqs)
        self._prefixes: OrderedDict[bytes, int] = OrderedDict()  # prefix -> its tokens, least recently used first
        self._computing: dict[bytes, asyncio.Event] = {}  # prefix -> set once the request prefilling it is done
        self.mm_cache = ProcessorCache(cfg.mm_processor_cache_gb)
        self._cached_tokens = 0
        self._models = orjson.dumps(
            {
                "object": "list",
                "data": [
                    {
                        "id": cfg.served_name,
                        "object": "model",
                        "created": self.created,
                        "owned_by": "vllm",
                        "root": snapshot_path(cfg.profile.model, cfg.profile.revision),
                        "parent": None,
                        "max_model_len": self.limits.max_model_len,
                        "permission": [
                            {
                                "id": f"modelperm-{self.created:x}",
                                "object": "model_permission",
                                "created": self.created,
                                "allow_create_engine": False,
                                "allow_sampling": True,
                                "allow_logprobs": True,
                                "allow_search_indices": False,
                                "allow_view": True,
                                "allow_fine_tuning": False,
                                "organization": "*",
                                "group": None,
                                "is_blocking": False,
                            }
                        ],
                    }
                ],
            }
        )

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=[_not_found])
        api: list[tuple[str, str, Any]] = [
            ("GET", "/health", self.health),
            ("GET", "/v1/models", self.models),
            ("POST", CHAT, self.chat),
        ]
        if self.cfg.dialect.batch:
            api.append(("POST", BATCH, self.chat_batch))
        for method, path, handler in api:
            app.router.add_route(method, path, handler)
        paths: dict[str, dict[str, Any]] = {}
        for method, path, handler in api:
            paths.setdefault(path, {})[method.lower()] = {"operationId": handler.__name__}
        self._openapi = orjson.dumps(
            {"openapi": "3.1.0", "info": {"title": "FastAPI", "version": "0.1.0"}, "paths": paths}
        )
        app.router.add_get("/openapi.json", self.openapi)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/_sim/mode", self.mode)
        return app

    # ---- endpoints ----------------------------------------------------------------------------

    def _ready(self) -> bool:
        return not self.engine_dead and time.time() - self.started >= self.cfg.warmup_s

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self._ready() else 503)

    async def models(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        return web.Response(body=self._models, content_type="application/json")

    async def openapi(self, request: web.Request) -> web.Response:
        """The API's paths, as FastAPI lists them for vLLM: a client learns from it whether the batch endpoint
        exists (an unknown path and an unknown model both answer 404)."""
        return web.Response(body=self._openapi, content_type="application/json")

    async def mode(self, request: web.Request) -> web.Response:
        """Test hook: switch engine-dead mode at run time; `reset_mm_cache` empties the processor cache (as a
        restart would, or vLLM's dev-mode /reset_mm_cache)."""
        body = orjson.loads(await request.read())
        self.engine_dead = bool(body.get("engine_dead", self.engine_dead))
        if body.get("reset_mm_cache"):
            self.mm_cache.clear()
        return web.json_response({"engine_dead": self.engine_dead, "mm_cache_items": len(self.mm_cache)})

    async def metrics(self, request: web.Request) -> web.Response:
        stats = self.stats
        stats.tick()
        name = self.cfg.served_name
        label = f'{{model_name="{name}"}}'
        lines = [
            f"vllm:num_requests_running{label} {stats.running}",
            f"vllm:num_requests_waiting{label} {stats.waiting}",
            f"vllm:prompt_tokens_total{label} {stats.prompt_tokens}",
            f"vllm:prefix_cache_queries_total{label} {stats.prefix_queries}",
            f"vllm:prefix_cache_hits_total{label} {stats.prefix_hits}",
            f"vllm:mm_cache_queries_total{label} {self.mm_cache.queries}",
            f"vllm:mm_cache_hits_total{label} {self.mm_cache.hits}",
            f"vllm:kv_cache_usage_perc{label} {min(1.0, self._cached_tokens / self.cfg.prefix_cache_tokens):.6f}",
            *(
                f'vllm:iteration_tokens_total_bucket{{le="{le}.0",model_name="{name}"}} {n}'
                for le, n in zip(ITERATION_BUCKETS, stats.iteration_buckets, strict=True)
            ),
            f'vllm:iteration_tokens_total_bucket{{le="+Inf",model_name="{name}"}} {stats.iterations}',
            f"vllm:iteration_tokens_total_count{label} {stats.iterations}",
            f"vllm:iteration_tokens_total_sum{label} {stats.iteration_tokens}",
            f'vllm:request_success_total{{finished_reason="length",model_name="{name}"}} {stats.success}',
            f"pool_sim:requests_total{label} {stats.requests}",
            f"pool_sim:running_seconds_total{label} {stats.running_s:.6f}",
            f"pool_sim:running_peak{label} {stats.peak_running}",
            f"pool_sim:waiting_peak{label} {stats.peak_waiting}",
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, batch=False)

    async def chat_batch(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions/batch (vLLM 0.22 and later): `messages` is a list of conversations that
        share the other fields; one choice per conversation, by index; usage summed over the batch."""
        return await self._serve(request, batch=True)

    async def _serve(self, request: web.Request, batch: bool) -> web.StreamResponse:
        if (denied := self._auth(request)) is not None:
            return denied
        raw = await request.read()
        self.stats.requests += 1
        if request.content_type != "application/json":
            return self._error(SimError(400, self.cfg.dialect.text("media type"), "Bad Request"))
        if self.cfg.exit_after is not None and self.stats.requests >= self.cfg.exit_after:
            os._exit(3)  # a crash, not a shutdown: in-flight requests see the connection drop
        if not self._ready():
            return self._error(SimError(503, "The engine is not ready or has died.", "ServiceUnavailableError"))
        try:
            body: Any = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            body = SimError(400, f"JSON decode error: {e}")
        fault = self.cfg.faults.draw(raw, _conversations(body) if batch else ())
        if fault in ("500", "503", "429"):
            return self._error(SimError(int(fault), f"injected fault {fault}", "InternalServerError"))
        if fault == "stale":
            mm_hash = hashlib.blake2b(raw, digest_size=16).hexdigest()
            return self._error(SimError(500, f"Expected a cached item for mm_hash={mm_hash!r}", "InternalServerError"))
        if fault == "hang":
            await asyncio.sleep(self.cfg.hang_s)
        try:
            if isinstance(body, SimError):
                raise body
            lim, cache = self.limits, self.mm_cache
            parsed = check_batch(body, lim, cache) if batch else [check(body, lim, cache)]
        except SimError as e:
            return self._error(e)
        await asyncio.gather(*(self._run(p) for p in parsed))  # each conversation is a sequence of its own
        if fault == "reset":
            resp = web.StreamResponse(
                status=200, headers={"Content-Type": "application/json", "Content-Length": "4096"}
            )
            await resp.prepare(request)
            await resp.write(b'{"id": "chatcmpl-')
            if request.transport is not None:
                request.transport.abort()
            return resp
        if fault == "malformed":
            return web.Response(
                body=b'{"id": "chatcmpl-x", "choices": [{"index": 0, "logpro',
                status=200,
                content_type="application/json",
            )
        return web.Response(
            body=self._completion(raw, parsed, with_logprobs=fault != "nologprobs"), content_type="application/json"
        )

    # ---- pieces -------------------------------------------------------------------------------

    def _auth(self, request: web.Request) -> web.Response | None:
        key = self.cfg.api_key
        if key is None or request.headers.get("Authorization") == f"Bearer {key}":
            return None
        return web.Response(status=401, body=b'{"error": "Unauthorized"}', content_type="application/json")

    def _error(self, e: SimError) -> web.Response:
        err = {"message": e.message, "type": e.etype, "param": e.param, "code": e.status}
        body = {"object": "error", **err} if self.cfg.old_errors else {"error": err}
        return web.Response(status=e.status, body=orjson.dumps(body), content_type="application/json")

    async def _run(self, p: Parsed) -> None:
        """One sequence: it reuses the prefixes (a video's frames, an item's question) that a request before it
        prefilled, and is answered no earlier than that prefill is done. vLLM puts a prefix's blocks in its
        cache when it schedules their prefill (`KVCacheManager.allocate_slots` caches the tokens it is about
        to compute) and the scheduler takes its waiting requests in order, so a sibling sent together with
        the first conversation (one batch, or requests side by side) skips the frames' prefill, and the
        vision encoder through the encoder cache, but runs in the same engine iteration as that prefill or a
        later one: it pays its own tokens and waits for the prefill it reads."""
        stats = self.stats
        stats.prompt_tokens += p.prompt_tokens
        stats.prefix_queries += p.prompt_tokens
        whole = hashlib.blake2b(p.image_key + p.text.split("\nA. ", 1)[0].encode(), digest_size=12).digest()
        prefixes = [(whole, p.prefix_tokens - p.image_tokens)]
        if p.image_key:
            prefixes.insert(0, (p.image_key, p.image_tokens))
        hit = {key: self._cached(key, tokens) for key, tokens in prefixes}
        seen_images = hit.get(p.image_key, False)
        if hit[whole]:
            stats.prefix_hits += p.prefix_tokens  # another order of the same item: frames and question
        elif seen_images:
            stats.prefix_hits += p.image_tokens  # another item of the same video: its frames
        # a cached image prefix skips the vision encoder and its prefill; the text profiles were
        # calibrated on runs whose option orders already shared their question
        cost_tokens = p.prompt_tokens - (p.image_tokens if seen_images else 0)
        stats.iteration(cost_tokens)
        if self.cfg.zero_latency:
            stats.success += 1
            return
        reads = [e for key, h in hit.items() if h and (e := self._computing.get(key)) is not None]
        done = asyncio.Event()
        mine = [key for key, h in hit.items() if not h]
        for key in mine:
            self._computing[key] = done
        try:
            await self._occupy(cost_tokens)
            stats.success += 1
        finally:
            done.set()
            for key in mine:
                if self._computing.get(key) is done:
                    del self._computing[key]
        for e in reads:  # outside its slot: a request waiting on another never keeps that one from a slot
            await e.wait()

    async def _occupy(self, cost_tokens: int) -> None:
        """A running sequence: one of `max_num_seqs` slots for as long as its tokens take."""
        stats = self.stats
        prof = self.cfg.profile
        busy_s = (prof.base_latency_s + cost_tokens * self.cfg.max_num_seqs / prof.tokens_per_s) / self.cfg.speed
        stats.waiting += 1
        if self._slots.locked():  # it waits for a slot
            stats.peak_waiting = max(stats.peak_waiting, stats.waiting)
        async with self._slots:
            stats.waiting -= 1
            stats.tick()
            stats.running += 1
            stats.peak_running = max(stats.peak_running, stats.running)
            try:
                await asyncio.sleep(busy_s)
            finally:
                stats.tick()
                stats.running -= 1

    def _cached(self, key: bytes, tokens: int) -> bool:
        """Seen recently; now it is. Least recently used prefixes go first, as vLLM evicts its KV blocks."""
        if key in self._prefixes:
            self._prefixes.move_to_end(key)
            return True
        self._prefixes[key] = tokens
        self._cached_tokens += tokens
        while self._cached_tokens > self.cfg.prefix_cache_tokens and len(self._prefixes) > 1:
            self._cached_tokens -= self._prefixes.popitem(last=False)[1]
        return False

    def _completion(self, raw: bytes, parsed: list[Parsed], with_logprobs: bool) -> bytes:
        d = self.cfg.dialect
        choices = []
        for index, p in enumerate(parsed):
            top = answer(self.cfg.profile, p.text, p.n_images, max(p.top_k, 1))
            tok, lp = top[0]
            entries = [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in top[: p.top_k]]
            logprobs: Any = None
            if with_logprobs:
                logprobs = {
                    "content": [{"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": entries}]
                }
            choices.append(
                {
                    "index": index,
                    "message": {"role": "assistant", "content": tok, **d.message},
                    "logprobs": logprobs,
                    "finish_reason": "length",
                    **d.choice,
                }
            )
        rid = hashlib.blake2b(raw, digest_size=16).hexdigest()
        prompt_tokens = sum(p.prompt_tokens for p in parsed)
        return orjson.dumps(
            {
                "id": f"chatcmpl-{rid}",
                "object": "chat.completion",
                "created": self.created,
                "model": self.cfg.served_name,
                "choices": choices,
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "total_tokens": prompt_tokens + len(parsed),
                    "completion_tokens": len(parsed),
                    **d.usage,
                },
                **d.body,
            }
        )


def _conversations(body: Any) -> list[bytes]:
    """A batch body's conversations, each as its own bytes (what a fault is drawn on); none if it is no batch."""
    msgs = body.get("messages") if isinstance(body, dict) else None
    return [orjson.dumps(c) for c in msgs] if isinstance(msgs, list) else []


@web.middleware
async def _not_found(request: web.Request, handler: Any) -> web.StreamResponse:
    """FastAPI's answer to a path it does not serve (vLLM 0.11.0 asked for the batch endpoint, for one)."""
    try:
        response: web.StreamResponse = await handler(request)
    except web.HTTPNotFound:
        return web.json_response({"detail": "Not Found"}, status=404)
    return response
