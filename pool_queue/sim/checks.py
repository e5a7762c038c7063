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

from .dialects import Dialect, dialect


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


def image_tokens(w: int, h: int) -> int:
    """Qwen3-VL: 16-px patches merged 2x2, sides rounded to multiples of 32 (448x252 -> 112)."""
    return max(1, round(w / 32)) * max(1, round(h / 32))


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


def check(body: Any, lim: Limits) -> Parsed:
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        raise SimError(400, "messages: field required")
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
    cont = bool(body.get("continue_final_message", False))
    if cont and body.get("add_generation_prompt", True):
        raise SimError(400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    msgs = body["messages"]
    if cont and (not isinstance(msgs[-1], dict) or msgs[-1].get("role") != "assistant"):
        raise SimError(
            400, "continue_final_message is set but the final message does not appear to be an assistant message"
        )
    texts: list[str] = []
    urls: list[str] = []
    for m in msgs:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            texts.append(content)
            continue
        for part in content or []:
            if part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            elif part.get("type") == "image_url":
                urls.append(str((part.get("image_url") or {}).get("url", "")))
    if len(urls) > lim.max_images:
        raise SimError(400, d.text("images", most=lim.max_images), param=d.param("image"))
    img_tokens = sum(image_tokens(*_image_size(u)) for u in urls)
    user_text = texts[0] if texts else ""
    total = img_tokens + sum(text_tokens(t) for t in texts) + 6 * len(msgs)
    if total > lim.max_model_len:
        raise SimError(400, d.text("too long", most=lim.max_model_len, total=total), param=d.param("input_tokens"))
    prefix = img_tokens + text_tokens(user_text.split("\nA. ", 1)[0])
    return Parsed(
        text=user_text,
        n_images=len(urls),
        prompt_tokens=total,
        prefix_tokens=prefix,
        image_tokens=img_tokens,
        image_key=hashlib.blake2b("\n".join(urls).encode(), digest_size=12).digest() if urls else b"",
        top_k=int(top_k or 0) if logprobs else 0,
    )
