"""The vLLM client of one worker: model check, health, and forwards with retries.

httpx is the API. Forwards, thousands a second, go straight to the transport (`SlimTransport`, over
aiohttp) with a request built from parts made once per server: httpx's client layer costs more CPU
than the whole rest of a forward (benchmarks/http_paths.py). The rare calls (/health, /v1/models)
use an httpx.AsyncClient over the same transport. A transient failure while the server is down is
not charged to the item: the client waits for /health and sends again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from pool_queue.errors import ForwardError, RetriesExhausted, ServerMisconfigured, ServerUnreachable
from pool_queue.observe import prefix_cache
from pool_queue.proc.progress import duration
from pool_queue.protocol import BATCH_PATH, lists_batch

from .transport import SlimTransport
from .waiting import Note, Stop

log = logging.getLogger(__name__)


class BatchFailed(Exception):
    """A batch request that did not answer every conversation: its items are sent again one by one."""


class _Transient(Exception):
    pass


@dataclass(frozen=True)
class Answer:
    top: list[tuple[str, float]]
    prompt_tokens: int | None
    attempts: int
    latency_s: float
    batch: bool = False  # one conversation of a batch request


def _error_text(resp: httpx.Response) -> str:
    try:
        body = orjson.loads(resp.content)
    except orjson.JSONDecodeError:
        return resp.text[:300]
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        return str(err.get("message", err))[:500]
    return str(err)[:500]


def parse_answer(content: bytes) -> tuple[list[tuple[str, float]], int | None]:
    """Top-k of the first generated token, in the order sent, and usage.prompt_tokens."""
    body, choices = _choices(content)
    usage = body.get("usage") or {}
    return _top(choices[0]), usage.get("prompt_tokens")


def parse_batch(content: bytes, n: int) -> tuple[list[list[tuple[str, float]]], int | None]:
    """Top-k of each conversation of a batch answer, by the choice's `index`, and the batch's prompt tokens
    (its `usage` sums every conversation: no conversation's own count is known)."""
    body, choices = _choices(content)
    by_index = {c.get("index"): c for c in choices if isinstance(c, dict)}
    if set(by_index) != set(range(n)) or len(choices) != n:
        raise _Transient(f"malformed batch response: {len(choices)} choice(s) for {n} conversations")
    usage = body.get("usage") or {}
    return [_top(by_index[i]) for i in range(n)], usage.get("prompt_tokens")


def _choices(content: bytes) -> tuple[dict[str, Any], list[Any]]:
    try:
        body = orjson.loads(content)
        choices = body["choices"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as e:
        raise _Transient(f"malformed response: {e}") from e
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _Transient("malformed response: no choices")
    return body, choices


def _top(choice: dict[str, Any]) -> list[tuple[str, float]]:
    lp = choice.get("logprobs")
    if not lp or not lp.get("content") or not lp["content"][0].get("top_logprobs"):
        raise ForwardError("response has no logprobs (is the server vLLM with --max-logprobs >= 20?)")
    return [(str(t["token"]), float(t["logprob"])) for t in lp["content"][0]["top_logprobs"]]


class VLLMClient:
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        max_attempts: int = 4,
        max_connections: int = 256,
        backoff_s: float = 0.5,
        note_s: float = 60.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.note_s = note_s  # a wait that lasts says so this often
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.transport = SlimTransport(max_connections, timeout_s)
        timeout = httpx.Timeout(timeout_s, connect=10.0)
        self.http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, transport=self.transport, timeout=timeout
        )
        self._forward_url = httpx.URL(self.base_url + "/v1/chat/completions")
        self._batch_url = httpx.URL(self.base_url + BATCH_PATH)
        self._forward_headers = httpx.Headers(headers)
        self._probe: asyncio.Task[bool] | None = None
        self.outage_s = 0.0  # time spent waiting for a down server
        self._down_since: float | None = None
        self._down_note: Note
        self.retries = 0
        self._waiting = 0  # forwards sent (or waiting for /health) and not yet answered
        self._quiet_from = time.monotonic()  # the last answer, or when forwards began waiting after none

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> VLLMClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def silent_s(self) -> float:
        """How long forwards have waited with no usable answer from the server (0 with none waiting). A
        restarting server is silent too; one wedged, or stopped with its port open, stays so."""
        return time.monotonic() - self._quiet_from if self._waiting else 0.0

    def _answered(self) -> None:
        self._quiet_from = time.monotonic()

    @property
    def up(self) -> bool:
        """False while forwards wait for a server whose /health fails."""
        return self._down_since is None

    # ---- server checks --------------------------------------------------------------------------

    async def healthy(self) -> bool:
        try:
            return (await self.http.get("/health", timeout=5.0)).status_code == 200
        except httpx.HTTPError:
            return False

    async def _server_up(self) -> bool:
        """One /health probe at a time; concurrent callers share its answer."""
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self.healthy())
        return await asyncio.shield(self._probe)

    async def wait_up(self, poll_s: float = 1.0) -> None:
        """Wait until /health answers; an outage is logged and timed once, however many forwards wait (and
        said again once a minute: forwards wait here, their jobs go back once the server is silent too long)."""
        while not await self._server_up():
            if self._down_since is None:
                self._down_since = time.monotonic()
                self._down_note = Note(self.base_url, "its /health", "forwards wait, no item is charged", self.note_s)
                log.warning("%s is down (/health fails): waiting for it; no item is charged", self.base_url)
            self._down_note.tick()
            await asyncio.sleep(poll_s)
        if self._down_since is not None:
            took_s = time.monotonic() - self._down_since
            self._down_since = None
            self.outage_s += took_s
            log.warning("%s is back after %.0f s", self.base_url, took_s)

    async def wait_first(self, limit_s: float, stop: Stop, poll_s: float = 1.0) -> None:
        """At start: wait up to `limit_s` for /health (vLLM takes minutes to load), or until `stop`. A port
        that accepts the connection but does not speak HTTP (a Redis port, say), or an HTTP server with no
        /health at this URL, fails at once: no wait would help."""
        deadline = time.monotonic() + limit_s
        note = Note(self.base_url, "the vLLM server (/health)", f"gives up after {duration(limit_s)}", self.note_s)
        while True:
            try:
                r = await self.http.get("/health", timeout=5.0)
                if r.status_code == 200:
                    return
                if r.status_code == 404:
                    raise ServerMisconfigured(
                        f"{self.base_url}/health answers HTTP 404: not a vLLM server's base URL "
                        "(pass the server's http://HOST:PORT, which serves /health and /v1)"
                    )
                why = f"/health answers HTTP {r.status_code}"
            except (httpx.ConnectError, httpx.TimeoutException) as e:
                why = f"nothing answers ({e})"
            except httpx.TransportError as e:
                raise ServerUnreachable(
                    f"{self.base_url} accepts connections but does not answer HTTP ({e}): is it the vLLM port?"
                ) from e
            if time.monotonic() >= deadline:
                raise ServerUnreachable(f"no vLLM server ready at {self.base_url} within {limit_s:.0f} s: {why}")
            note.tick()
            await stop.sleep(poll_s)

    async def served_models(self) -> list[dict[str, Any]]:
        r = await self.http.get("/v1/models", timeout=15.0)
        if r.status_code in (401, 403):
            raise ServerMisconfigured(
                f"{self.base_url}: /v1/models refused the API key (HTTP {r.status_code}); "
                "set VLLM_API_KEY to the server's key"
            )
        r.raise_for_status()
        return list(orjson.loads(r.content).get("data", []))

    async def server_metrics(self) -> dict[str, float]:
        """The server's `vllm:` figures (`prefix_cache.samples`); none when it cannot tell."""
        try:
            r = await self.http.get("/metrics", timeout=5.0)
        except httpx.HTTPError:
            return {}
        return prefix_cache.samples(r.text) if r.status_code == 200 else {}

    # ---- forwards -------------------------------------------------------------------------------

    async def batch_endpoint(self) -> bool:
        """Whether the server has the batch endpoint (vLLM 0.22 and later), as its /openapi.json lists it;
        never guessed from a 404, which vLLM also answers for a model it does not serve."""
        try:
            r = await self.http.get("/openapi.json", timeout=15.0)
        except httpx.HTTPError:
            return False
        return r.status_code == 200 and lists_batch(r.content)

    @contextlib.contextmanager
    def _awaited(self) -> Iterator[None]:
        """A request out: while any is, the time since the last answer counts as silence."""
        if not self._waiting:
            self._quiet_from = time.monotonic()
        self._waiting += 1
        try:
            yield
        finally:
            self._waiting -= 1

    async def _request(self, url: httpx.URL, body: bytes) -> httpx.Response:
        try:
            r = await self.transport.handle_async_request(
                httpx.Request("POST", url, headers=self._forward_headers, content=body)
            )
        except httpx.HTTPError as e:
            raise _Transient(f"{type(e).__name__}: {e}") from e
        if r.status_code != 429 and r.status_code < 500:
            self._answered()  # an answer, even a refusal: the server is there
        return r

    async def _post(self, body: bytes) -> tuple[list[tuple[str, float]], int | None]:
        r = await self._request(self._forward_url, body)
        if r.status_code == 200:
            return parse_answer(r.content)
        text = _error_text(r)
        if r.status_code == 429 or r.status_code >= 500:
            raise _Transient(f"HTTP {r.status_code}: {text}")
        if r.status_code in (401, 403, 404):
            raise ServerMisconfigured(f"{self.base_url}: HTTP {r.status_code}: {text}")
        raise ForwardError(f"HTTP {r.status_code}: {text}")

    async def forward(self, body: bytes) -> Answer:
        """Send until it succeeds, fails permanently, or uses up its attempts (outages not counted)."""
        attempts = 0
        t0 = time.monotonic()
        with self._awaited():
            while True:
                try:
                    top, tokens = await self._post(body)
                    return Answer(top, tokens, attempts + 1, time.monotonic() - t0)
                except _Transient as e:
                    if not await self._server_up():
                        await self.wait_up()
                        continue
                    attempts += 1
                    self.retries += 1
                    if attempts >= self.max_attempts:
                        raise RetriesExhausted(f"{e} (after {attempts} attempts)", attempts) from e
                    await asyncio.sleep(self.backoff_s * 2 ** (attempts - 1) * (0.5 + random.random()))

    async def forward_batch(self, body: bytes, n: int) -> tuple[list[Answer], int | None]:
        """One batch of `n` conversations, sent once (an outage is waited out, as for a forward). Any failure
        is a BatchFailed: the caller sends the conversations again one by one, so that no item pays for
        another's fault. Its answers carry no prompt tokens: the batch's usage, returned beside them, sums
        every conversation."""
        t0 = time.monotonic()
        with self._awaited():
            while True:
                try:
                    r = await self._request(self._batch_url, body)
                except _Transient as e:
                    if not await self._server_up():
                        await self.wait_up()
                        continue
                    raise BatchFailed(str(e)) from e
                if r.status_code != 200:
                    raise BatchFailed(f"HTTP {r.status_code}: {_error_text(r)}")
                try:
                    tops, tokens = parse_batch(r.content, n)
                except (_Transient, ForwardError) as e:
                    raise BatchFailed(str(e)) from e
                took_s = time.monotonic() - t0
                return [Answer(top, None, 1, took_s, batch=True) for top in tops], tokens
