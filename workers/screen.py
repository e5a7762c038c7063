"""One item through one step: frames -> request bodies -> forwards -> judged row."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from pool_queue.errors import FrameError, ItemFailure, ServerMisconfigured
from pool_queue.inputs.frames import DEFAULT_MAX_PIXELS, FrameEncoder, find_frames
from pool_queue.protocol import LETTERS, Forward, Protocol, image_part
from pool_queue.rows import ErrorKind, ForwardRecord, Row

from .client import Answer, BatchFailed, VLLMClient
from .slots import Slots

log = logging.getLogger(__name__)
VideoSend = Literal["adjacent", "serial"]
CACHE_MISS = "Cache miss"  # vLLM's text for a uuid-only frame its processor cache does not hold
MISS_STREAK = 3  # batches failed so in a row: the server keeps no cache, siblings carry their frames again


@dataclass(frozen=True)
class Item:
    item_id: str
    benchmark: str
    video_id: str
    question: str
    options: list[str]
    gold: int


@dataclass(frozen=True)
class Frames:
    """A video's frames of one step, prepared once for all its items, each with a content uuid."""

    urls: list[str]
    uuids: list[str]
    idx: list[int]
    n_total: int

    def parts(self, sent: bool) -> list[dict[str, Any]]:
        """The image parts of one conversation: the frames themselves, or their uuids alone."""
        return [image_part(u if sent else "", h) for u, h in zip(self.urls, self.uuids, strict=True)]


def content_id(url: str) -> str:
    """A frame's uuid: a hash of exactly the bytes sent, so equal uuids are equal frames."""
    return hashlib.blake2b(url.encode(), digest_size=16).hexdigest()


def batch_cost(k: int, n_frames: int, lead: bool) -> float:
    """What a batch of `k` conversations costs the server, in forwards (the in-flight bound's unit). Without
    frames every conversation is a forward of its own. With frames the server encodes and prefills them once,
    for the video's first conversation (`lead`: this batch carries it); every other conversation reuses them
    (processor, encoder and prefix caches) and costs its text, about one frame's worth of tokens: 1 / (frames
    + 1) of a forward."""
    if not n_frames:
        return float(k)
    sibling = 1 / (n_frames + 1)
    return (1.0 if lead else sibling) + (k - 1) * sibling


@dataclass(frozen=True)
class Identity:
    """Who produced a row: stamped into every row."""

    fingerprint: str
    model: str
    revision: str
    server: str
    worker: str


class Screener:
    def __init__(
        self,
        protocol: Protocol,
        client: VLLMClient,
        frames_dir: Path,
        who: Identity,
        inflight: Slots,
        max_frame_pixels: int = DEFAULT_MAX_PIXELS,
        video_send: VideoSend = "adjacent",
    ) -> None:
        self.protocol = protocol
        self.client = client
        self.frames_dir = frames_dir
        self.who = who
        self.inflight = inflight
        self.encoder = FrameEncoder(protocol.image_long_side, protocol.jpeg_quality, max_pixels=max_frame_pixels)
        self.in_flight = 0  # forwards sent, not yet answered (for metrics and pool-status)
        self.serial = video_send == "serial"  # a video's first item alone, then its siblings on a warm cache
        self.first_of: dict[str, asyncio.Event] = {}  # video -> set when its first item is answered
        self.batch = False  # the server has the batch endpoint: a video's items go as one request
        self.refs = True  # in a batch, siblings name the frames by uuid only (the server's processor cache)
        self.misses = 0  # batches failed in a row on a uuid the server's cache did not hold
        self.fallbacks = 0  # batches sent again one request per forward
        self.tokens: Counter[int] = Counter()  # prompt tokens answered per step, since the cache meter's last read

    def _images(self, step: int, item: Item) -> tuple[list[str], list[int], int]:
        """Data URLs of the step's frames (runs in a thread: decoding and resizing is CPU work)."""
        frames = find_frames(self.frames_dir, item.video_id)
        idx = self.protocol.frame_indices(step, len(frames))
        return [self.encoder.data_url(frames[i]) for i in idx], idx, len(frames)

    async def _send(self, step: int, raw: bytes) -> Answer:
        async with self.inflight.take():
            self.in_flight += 1
            try:
                answer = await self.client.forward(raw)
            finally:
                self.in_flight -= 1
        self.tokens[step] += answer.prompt_tokens or 0
        return answer

    def error_row(
        self, step: int, item: Item | str, error: str, kind: ErrorKind, started: float | None = None, **more: Any
    ) -> Row:
        """The one way an error row is made (the job loop uses it too)."""
        it = item if isinstance(item, Item) else None
        return Row(
            item_id=it.item_id if it else str(item),
            step=step,
            status="error",
            benchmark=it.benchmark if it else "",
            video_id=it.video_id if it else "",
            error=error,
            error_kind=kind,
            **self._stamp(),
            started_at=started or time.time(),
            finished_at=time.time(),
            **more,
        )

    def _stamp(self) -> dict[str, Any]:
        """Who made a row: the protocol, the model, the server and the worker."""
        w = self.who
        return {"fingerprint": w.fingerprint, "model": w.model, "revision": w.revision, "server": w.server,
                "worker": w.worker}  # fmt: skip

    async def screen(self, step: int, item: Item) -> Row:
        """One item's row, whatever happens to it: its data (bad_input), the server (permanent, transient)
        or our own code (internal). Only worker-level failures (a misconfigured server) propagate."""
        started = time.time()
        try:
            orders, raws, idx, n_total = await self._prepare(step, item)
        except FrameError as e:
            return self.error_row(step, item, str(e), "bad_input", started)
        except (ValueError, TypeError, KeyError, IndexError, OSError) as e:  # what the item's fields caused
            return self.error_row(step, item, f"{type(e).__name__} preparing the request: {e}", "bad_input", started)
        try:
            async with self._video_turn(item.video_id if idx else None):
                answers = await asyncio.gather(*(self._send(step, r) for r in raws), return_exceptions=True)
            return self._judge(step, item, orders, answers, idx, n_total, started)
        except ServerMisconfigured:
            raise
        except Exception as e:  # a bug of ours: the item gets a row saying so, the chunk goes on
            log.exception("item %s, step %s: internal error", item.item_id, step)
            return self.error_row(step, item, f"{type(e).__name__}: {e}", "internal", started)

    async def screen_group(self, step: int, items: list[Item]) -> list[Row]:
        """Items of one video (or one item alone): batch requests where the server has the endpoint and
        there is more than one forward to send together, else each item's own requests."""
        n = len(items) * self.protocol.steps[step].n_orders
        if not self.batch or n < 2:
            return await self._each(step, items)
        try:
            frames = await self._frames(step, items[0])
        except Exception:  # each item meets the same problem on its own path and gets its own row
            return await self._each(step, items)
        per = max(1, self.inflight.size // self.protocol.steps[step].n_orders)  # a batch within the bound
        parts = [items[i : i + per] for i in range(0, len(items), per)]
        sends = (self._batch(step, p, frames, lead=i == 0) for i, p in enumerate(parts))
        return [r for rows in await asyncio.gather(*sends) for r in rows]

    async def _each(self, step: int, items: list[Item]) -> list[Row]:
        return list(await asyncio.gather(*(self.screen(step, it) for it in items)))

    async def _frames(self, step: int, item: Item) -> Frames:
        if self.protocol.steps[step].frames == "none":
            return Frames([], [], [], 0)
        urls, idx, n_total = await asyncio.to_thread(self._images, step, item)
        return Frames(urls, [content_id(u) for u in urls], idx, n_total)

    async def _batch(self, step: int, items: list[Item], frames: Frames, lead: bool) -> list[Row]:
        """One batch request: the first conversation carries the frames, each frame with its uuid, the
        others the uuids alone, so the server processes the frames once. A batch that fails for any reason
        is sent again as each item's own requests (frames, no uuid): no item pays for another's fault, and
        a server whose cache lost a uuid is asked nothing of it."""
        started = time.time()
        conversations: list[list[dict[str, Any]]] = []
        planned: list[tuple[Item, list[list[int]], int]] = []  # item, its orders, its first conversation
        alone: list[Item] = []  # an item whose request cannot be made: its own path says why
        for it in items:
            first = len(conversations)
            try:
                orders = self.protocol.orders(step, it.item_id, len(it.options))
                for o in orders:
                    images = frames.parts(sent=not conversations or not self.refs)
                    conversations.append(self.protocol.messages(it.question, [it.options[i] for i in o], images))
            except (ValueError, TypeError, KeyError, IndexError):
                del conversations[first:]
                alone.append(it)
                continue
            planned.append((it, orders, first))
        if len(conversations) < 2:
            return await self._each(step, items)
        body = orjson.dumps(self.protocol.batch_body(step, conversations))
        k = len(conversations)
        try:
            async with self.inflight.take(batch_cost(k, len(frames.urls), lead)):
                self.in_flight += k
                try:
                    answers, tokens = await self.client.forward_batch(body, k)
                finally:
                    self.in_flight -= k
        except BatchFailed as e:
            self._fell_back(k, e)
            return await self._each(step, items)
        self.misses = 0
        self.tokens[step] += tokens or 0
        rows = [
            self._judge(step, it, orders, answers[i : i + len(orders)], frames.idx, frames.n_total, started)
            for it, orders, i in planned
        ]
        return rows + await self._each(step, alone)

    def _fell_back(self, k: int, e: BatchFailed) -> None:
        self.fallbacks += 1
        log.warning("a batch of %d forwards failed (%s): sending them again one request each", k, e)
        self.misses = self.misses + 1 if CACHE_MISS in str(e) else 0
        if self.misses >= MISS_STREAK and self.refs:
            self.refs = False
            log.warning(
                "%s: %d batches in a row missed a frame in its processor cache (is --mm-processor-cache-gb 0?): "
                "from now on every conversation of a batch carries its frames",
                self.client.base_url, self.misses,
            )  # fmt: skip

    @contextlib.asynccontextmanager
    async def _video_turn(self, video_id: str | None) -> AsyncIterator[None]:
        """Serial sending: the first item of a video goes alone; its siblings wait until it is answered."""
        if not self.serial or video_id is None:
            yield
            return
        first = self.first_of.get(video_id)
        if first is not None:
            await first.wait()
            yield
            return
        self.first_of[video_id] = done = asyncio.Event()
        try:
            yield
        finally:
            done.set()
            del self.first_of[video_id]

    async def _prepare(self, step: int, item: Item) -> tuple[list[list[int]], list[bytes], list[int], int]:
        orders = self.protocol.orders(step, item.item_id, len(item.options))
        urls: list[str] = []
        idx: list[int] = []
        n_total = 0
        if self.protocol.steps[step].frames != "none":  # no thread hop for blind forwards
            urls, idx, n_total = await asyncio.to_thread(self._images, step, item)
        raws = [
            orjson.dumps(self.protocol.request_body(step, item.question, [item.options[i] for i in o], urls))
            for o in orders
        ]
        return orders, raws, idx, n_total

    def _judge(
        self,
        step: int,
        item: Item,
        orders: list[list[int]],
        answers: Sequence[Answer | BaseException],
        idx: list[int],
        n_total: int,
        started: float,
    ) -> Row:
        failures = [answer for answer in answers if isinstance(answer, BaseException)]
        attempts = sum(answer.attempts for answer in answers if isinstance(answer, Answer))
        if failures:
            worst = next((f for f in failures if not isinstance(f, ItemFailure)), failures[0])
            if not isinstance(worst, ItemFailure):
                raise worst  # a misconfigured server (worker-level) or a bug (internal)
            attempts += sum(getattr(f, "attempts", 1) for f in failures)
            more = {"attempts": attempts, "frame_indices": idx, "n_frames_total": n_total}
            return self.error_row(step, item, str(worst), worst.kind, started, **more)
        oks = [answer for answer in answers if isinstance(answer, Answer)]
        n = len(item.options)
        judged = [
            self.protocol.judge_forward(answer.top, n, order.index(item.gold))
            for order, answer in zip(orders, oks, strict=True)
        ]
        verdict = self.protocol.judge_item(step, orders, judged)
        return Row(
            item_id=item.item_id,
            step=step,
            status="ok",
            benchmark=item.benchmark,
            video_id=item.video_id,
            **self._stamp(),
            started_at=started,
            attempts=attempts,
            **verdict.model_dump(),
            forwards=[_record(*each) for each in zip(orders, oks, judged, strict=True)],
            frame_indices=idx,
            n_frames_total=n_total or None,
            finished_at=time.time(),
        )


def _record(order: list[int], answer: Answer, forward: Forward) -> ForwardRecord:
    """What a row keeps of one forward: the protocol's reading, with the raw top-k it was read from."""
    return ForwardRecord(
        order=order,
        gold=LETTERS[forward.gold],
        logprobs={LETTERS[i]: v for i, v in enumerate(forward.logprobs)},
        floored=[LETTERS[i] for i, fl in enumerate(forward.floored) if fl],
        pred=LETTERS[forward.pred],
        margin=forward.margin,
        hit=forward.hit,
        top=answer.top,
        prompt_tokens=answer.prompt_tokens,
        attempts=answer.attempts,
        latency_s=round(answer.latency_s, 4),
        sent="batch" if answer.batch else "single",
    )
