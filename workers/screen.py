"""One item through one step: frames -> request bodies -> forwards -> judged row."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from pool_queue.frames import DEFAULT_MAX_PIXELS, FrameEncoder, FrameError, find_frames
from pool_queue.protocol import LETTERS, Protocol
from pool_queue.rows import ForwardRecord, Row

from .client import Answer, ForwardError, VLLMClient


@dataclass(frozen=True)
class Item:
    item_id: str
    benchmark: str
    video_id: str
    question: str
    options: list[str]
    gold: int


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
        inflight: asyncio.Semaphore,
        max_frame_pixels: int = DEFAULT_MAX_PIXELS,
    ) -> None:
        self.protocol = protocol
        self.client = client
        self.frames_dir = frames_dir
        self.who = who
        self.inflight = inflight
        self.encoder = FrameEncoder(protocol.image_long_side, protocol.jpeg_quality, max_pixels=max_frame_pixels)
        self.in_flight = 0  # forwards sent, not yet answered (for metrics and pool-status)

    def _images(self, step: int, item: Item) -> tuple[list[str], list[int], int]:
        """Data URLs of the step's frames (runs in a thread: decoding and resizing is CPU work)."""
        frames = find_frames(self.frames_dir, item.video_id)
        idx = self.protocol.frame_indices(step, len(frames))
        return [self.encoder.data_url(frames[i]) for i in idx], idx, len(frames)

    async def _send(self, body: dict[str, Any]) -> Answer:
        raw = orjson.dumps(body)
        async with self.inflight:
            self.in_flight += 1
            try:
                return await self.client.forward(raw)
            finally:
                self.in_flight -= 1

    async def screen(self, step: int, item: Item) -> Row:
        started = time.time()
        base: dict[str, Any] = {
            "item_id": item.item_id,
            "step": step,
            "benchmark": item.benchmark,
            "video_id": item.video_id,
            "fingerprint": self.who.fingerprint,
            "model": self.who.model,
            "revision": self.who.revision,
            "server": self.who.server,
            "worker": self.who.worker,
            "started_at": started,
        }
        n = len(item.options)
        orders = self.protocol.orders(step, item.item_id, n)
        try:
            urls: list[str] = []
            idx: list[int] = []
            n_total = 0
            if self.protocol.steps[step].frames != "none":  # no thread hop for blind forwards
                urls, idx, n_total = await asyncio.to_thread(self._images, step, item)
            bodies = [
                self.protocol.request_body(step, item.question, [item.options[i] for i in o], urls) for o in orders
            ]
            answers = await asyncio.gather(*(self._send(b) for b in bodies), return_exceptions=True)
        except FrameError as e:
            return Row(**base, status="error", error=str(e), error_kind="permanent", finished_at=time.time())
        failures = [a for a in answers if isinstance(a, BaseException)]
        attempts = sum(a.attempts for a in answers if isinstance(a, Answer))
        if failures:
            worst = next((f for f in failures if not isinstance(f, ForwardError)), failures[0])
            if not isinstance(worst, ForwardError):
                raise worst  # not an item problem (misconfigured server, cancellation): no row
            attempts += sum(getattr(f, "attempts", 1) for f in failures)
            return Row(
                **base,
                status="error",
                error=str(worst),
                error_kind=worst.kind,
                attempts=attempts,
                frame_indices=idx,
                n_frames_total=n_total,
                finished_at=time.time(),
            )
        records = []
        judged = []
        for order, ans in zip(orders, answers, strict=True):
            assert isinstance(ans, Answer)
            f = self.protocol.judge_forward(ans.top, n, order.index(item.gold))
            judged.append(f)
            records.append(
                ForwardRecord(
                    order=order,
                    gold=LETTERS[f.gold],
                    logprobs={LETTERS[i]: v for i, v in enumerate(f.logprobs)},
                    floored=[LETTERS[i] for i, fl in enumerate(f.floored) if fl],
                    pred=LETTERS[f.pred],
                    margin=f.margin,
                    hit=f.hit,
                    top=ans.top,
                    prompt_tokens=ans.prompt_tokens,
                    attempts=ans.attempts,
                    latency_s=round(ans.latency_s, 4),
                )
            )
        first = judged[0]
        return Row(
            **base,
            status="ok",
            attempts=attempts,
            removed=self.protocol.removed(step, judged),
            pred=LETTERS[orders[0][first.pred]],
            margin=sum(f.margin for f in judged) / len(judged),
            n_hits=sum(f.hit for f in judged),
            n_perm=len(judged),
            forwards=records,
            frame_indices=idx,
            n_frames_total=n_total or None,
            finished_at=time.time(),
        )
