"""Request checks in vLLM's order, with vLLM's status codes and error texts (see vllm-reference.md)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import math
from dataclasses import dataclass, field
from typing import Any

from PIL import Image, UnidentifiedImageError

from ..launch.sizing import frame_tokens
from .dialects import Dialect, dialect
from .mmcache import ProcessorCache


class SimError(Exception):
    def __init__(self, status: int, message: str, etype: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.etype = etype
        self.param = param


@dataclass(frozen=True)
class Limits:
    served_name: str
    max_logprobs: int = 20
    max_images: int = 32
    max_model_len: int = 32768
    dialect: Dialect = field(default_factory=dialect)  # which release's texts


@dataclass(frozen=True)
class Parsed:
    text: str
    n_images: int
    prompt_tokens: int
    prefix_tokens: int  # tokens before the options (shared by an item's orders: prefix-cache hits)
    image_tokens: int  # the frames come first: shared by the items of one video
    image_key: bytes  # what the frames are (the prefix the items of one video share)
    top_k: int


def text_tokens(text: str) -> int:
    return max(1, math.ceil(len(text.encode()) / 4))


def _image_size(url: str) -> tuple[int, int]:
    try:
        head, data = url.split(",", 1)
        if not head.startswith("data:image/") or ";base64" not in head:
            raise ValueError("only base64 data URLs are supported here")
        with Image.open(io.BytesIO(base64.b64decode(data, validate=True))) as im:
            return im.size
    except (ValueError, binascii.Error, UnidentifiedImageError, OSError) as e:
        raise SimError(400, f"Failed to load image: cannot identify image file ({e})", param="image") from e


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def check_request(body: Any, lim: Limits, batch: bool = False) -> int:
    """The fields a batch shares among its conversations (all of a single request's but its messages); returns
    the top-k asked for (0 without logprobs)."""
    msgs = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(msgs, list) or not msgs:
        raise SimError(400, "messages: field required")
    if batch and not all(isinstance(c, list) and c for c in msgs):
        raise SimError(400, "messages: a batch takes a list of conversations, each a non-empty list of messages")
    d = lim.dialect
    model = body.get("model")
    if model != lim.served_name:
        raise SimError(404, d.text("model", model=model, served=lim.served_name), "NotFoundError", d.param("model"))
    logprobs = bool(body.get("logprobs", False))
    top_k = body.get("top_logprobs")
    if top_k is not None:
        if not logprobs:
            raise SimError(400, "when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")
        if top_k > lim.max_logprobs:
            raise SimError(400, d.text("top_logprobs", top_k=top_k, most=lim.max_logprobs), param=d.param("logprobs"))
    if body.get("continue_final_message", False) and body.get("add_generation_prompt", True):
        raise SimError(400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    if batch and body.get("n", 1) not in (None, 1):
        raise SimError(400, "Batch chat completions do not support `n > 1`. Please set `n` to 1.", param=d.param("n"))
    return int(top_k or 0) if logprobs else 0


def _images(parts: list[tuple[str, str | None]], lim: Limits, cache: ProcessorCache) -> list[tuple[str, int]]:
    """(mm_hash, tokens) of a conversation's image parts (url, uuid), in vLLM's order: every part with data is
    loaded, then all are looked up in the processor cache before any is stored, so a part without data must
    name an image cached by an earlier conversation or request."""
    loaded = [(uuid or _digest(url), frame_tokens(*_image_size(url)) if url else 0) for url, uuid in parts]
    cached = [cache.get(key) for key, _ in loaded]
    for idx, ((url, _), hit) in enumerate(zip(parts, cached, strict=True)):
        if hit is None and not url:
            raise SimError(400, lim.dialect.text("cache miss", modality="image", idx=idx))
    for (key, tokens), hit in zip(loaded, cached, strict=True):
        if hit is None:
            cache.put(key, tokens)
    return [(key, tokens if hit is None else hit) for (key, tokens), hit in zip(loaded, cached, strict=True)]


def check_conversation(msgs: list[Any], top_k: int, cont: bool, lim: Limits, cache: ProcessorCache) -> Parsed:
    """One conversation, rendered and its images processed (through `cache`) as vLLM's API server does."""
    d = lim.dialect
    if cont and (not isinstance(msgs[-1], dict) or msgs[-1].get("role") != "assistant"):
        raise SimError(
            400, "continue_final_message is set but the final message does not appear to be an assistant message"
        )
    texts: list[str] = []
    parts: list[tuple[str, str | None]] = []  # (url, uuid) of each image part; an empty url names a cached image
    for m in msgs:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            texts.append(content)
            continue
        for part in content or []:
            if part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            elif part.get("type") == "image_url":
                url = (part.get("image_url") or {}).get("url") or ""
                uuid = part.get("uuid")
                parts.append((str(url), str(uuid) if uuid else None))
    if len(parts) > lim.max_images:
        raise SimError(400, d.text("images", most=lim.max_images), param=d.param("image"))
    images = _images(parts, lim, cache)
    img_tokens = sum(tokens for _, tokens in images)
    user_text = texts[0] if texts else ""
    total = img_tokens + sum(text_tokens(t) for t in texts) + 6 * len(msgs)
    if total > lim.max_model_len:
        raise SimError(400, d.text("too long", most=lim.max_model_len, total=total), param=d.param("input_tokens"))
    prefix = img_tokens + text_tokens(user_text.split("\nA. ", 1)[0])
    keys = "\n".join(key for key, _ in images)
    return Parsed(
        text=user_text,
        n_images=len(images),
        prompt_tokens=total,
        prefix_tokens=prefix,
        image_tokens=img_tokens,
        image_key=hashlib.blake2b(keys.encode(), digest_size=12).digest() if images else b"",
        top_k=top_k,
    )


def check(body: Any, lim: Limits, cache: ProcessorCache) -> Parsed:
    """A request to /v1/chat/completions."""
    top_k = check_request(body, lim)
    return check_conversation(body["messages"], top_k, bool(body.get("continue_final_message")), lim, cache)


def check_batch(body: Any, lim: Limits, cache: ProcessorCache) -> list[Parsed]:
    """A request to /v1/chat/completions/batch: its conversations one after another, each through the cache
    the ones before it filled; the first that fails fails the whole batch with its error."""
    top_k = check_request(body, lim, batch=True)
    cont = bool(body.get("continue_final_message"))
    return [check_conversation(msgs, top_k, cont, lim, cache) for msgs in body["messages"]]
