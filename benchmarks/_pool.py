"""The benchmarks' synthetic pool and the protocol's request bodies for its items."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from pool_queue.demo.synth import FRAME_FORMATS, SynthConfig, generate
from pool_queue.inputs.frames import FrameEncoder, list_frames, video_folder
from pool_queue.inputs.items import load_items
from pool_queue.protocol import Protocol

P = Protocol()


def pool_items(
    root: Path, step: int, n: int, videos: int | None = None, per_video: int = 0, real_frames: bool = False
) -> list[dict[str, Any]]:
    """n valid items of `root` in video order, generating a pool there first when it has none. `per_video`:
    exactly that many items per video (1: every item its own video, nothing for vLLM's cache to reuse).
    `real_frames`: every frame a 448-px JPEG, as in the real pool (the workers send them untouched);
    otherwise half are larger JPEGs or PNGs the workers must resize and re-encode."""
    if not (root / "items").exists():
        # the real pool has ~2.7 items per video
        frames = (32, 34) if step == 3 else (8, 9)  # step 3 takes 32, step 2 the middle one
        n_videos = -(-n // per_video) if per_video else videos or max(50, int(n / 2.7))
        generate(root, SynthConfig(n_items=n, n_videos=n_videos, seed=7, k_fraction=0.0, missing_fraction=0.0,
                                   frames=frames, items_per_video=per_video,
                                   frame_formats=(("jpeg448", 1.0),) if real_frames else FRAME_FORMATS))  # fmt: skip
    table = load_items(root / "items").items.sort_by([("video_id", "ascending"), ("item_id", "ascending")])
    items: list[dict[str, Any]] = table.to_pylist()
    if len(items) < n:
        raise SystemExit(f"{root} has {len(items)} valid items, {n} needed")
    return items


def bodies(root: Path, step: int, items: list[dict[str, Any]]) -> list[bytes]:
    """Every forward's request body, frames prepared the workers' way (the orders of one item adjacent)."""
    enc, frames_dir = FrameEncoder(P.image_long_side, P.jpeg_quality), root / "frames" / "pool_frames"
    out = []
    for it in items:
        urls: list[str] = []
        if P.steps[step].frames != "none":
            d = video_folder(frames_dir, it["video_id"])[0]
            frames = list_frames(d) if d else []
            urls = [enc.data_url(frames[i]) for i in P.frame_indices(step, len(frames))]
        for o in P.orders(step, it["item_id"], len(it["options"])):
            out.append(orjson.dumps(P.request_body(step, it["question"], [it["options"][i] for i in o], urls)))
    return out
