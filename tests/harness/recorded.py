"""Real vLLM responses kept in the repo (tests/harness/realvllm/recorded/<release>/step<N>.json), one per
step for each tested release (the oldest and the newest).

They are recorded from the CPU vLLM of the `vllm` tests (POOL_RECORD=1 writes the running release's); the
simulator tests compare against them, each in that release's dialect, even where no vLLM is installed.
Image data URLs are stored as a placeholder and rebuilt, so a file stays a few KB.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import orjson
from PIL import Image

from pool_queue.protocol import Protocol

RECORDED = Path(__file__).parent / "realvllm" / "recorded"
IMAGE = "<jpeg 448x252>"
P = Protocol()
IMAGES = {1: 0, 2: 1, 3: 32}


def jpeg_url(size: tuple[int, int] = (448, 252), colour: tuple[int, int, int] = (90, 140, 30)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, "JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def request(step: int, with_images: bool = True) -> dict[str, Any]:
    url = jpeg_url() if with_images else IMAGE
    return P.request_body(step, "Which colour is the ball?", ["red", "green", "blue", "black"], [url] * IMAGES[step])


def shape(v: Any) -> Any:
    """Keys and JSON types at every level (numbers as one type: vLLM writes 0.0 and 0 alike)."""
    if isinstance(v, dict):
        return {k: shape(x) for k, x in sorted(v.items())}
    if isinstance(v, list):
        shapes = {orjson.dumps(shape(x)) for x in v}
        return [orjson.loads(s) for s in sorted(shapes)]
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    return "null" if v is None else type(v).__name__


def releases() -> list[str]:
    """The vLLM releases with recorded answers."""
    return sorted(p.name for p in RECORDED.iterdir() if p.is_dir())


def load(step: int, release: str) -> dict[str, Any]:
    rec: dict[str, Any] = orjson.loads((RECORDED / release / f"step{step}.json").read_bytes())
    return rec


def save(step: int, release: str, response: dict[str, Any]) -> None:
    (RECORDED / release).mkdir(parents=True, exist_ok=True)
    rec = {"vllm_version": release, "request": request(step, with_images=False), "response": response}
    (RECORDED / release / f"step{step}.json").write_bytes(orjson.dumps(rec, option=orjson.OPT_INDENT_2) + b"\n")
