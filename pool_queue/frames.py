"""The frame cache `frames/pool_frames/<video_id>/`: listing, selection, 448-px JPEG preparation.

A `video_id` is resolved only after a check that it is a plain name, and the resolved path must
sit inside the cache: no item can make a worker read outside it.
"""

from __future__ import annotations

import base64
import io
import re
from collections import OrderedDict
from pathlib import Path

from PIL import Image, UnidentifiedImageError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
_DIGITS = re.compile(r"(\d+)")


class FrameError(ValueError):
    """A frame file that cannot be used; the message names the file."""


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in _DIGITS.split(name) if p)


def video_dir(frames_dir: Path, video_id: str) -> Path | None:
    """The frame folder of a video, or None when the video has no frames here (`k:`, missing)."""
    if video_id.startswith("k:"):
        return None
    if not video_id or video_id in (".", "..") or any(c in video_id for c in "/\\\x00") or ".." in video_id:
        raise FrameError(f"unsafe video_id {video_id!r}")
    d = frames_dir / video_id
    if d.resolve().parent != frames_dir.resolve():
        raise FrameError(f"video_id {video_id!r} resolves outside the frame cache")
    return d if d.is_dir() else None


def list_frames(d: Path) -> list[Path]:
    """Image files directly inside a video folder, in natural order (frame_2 before frame_10)."""
    files = [p for p in d.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()]
    return sorted(files, key=lambda p: natural_key(p.name))


def has_frames(frames_dir: Path, video_id: str) -> bool:
    try:
        d = video_dir(frames_dir, video_id)
    except FrameError:
        return False
    return d is not None and any(p.suffix.lower() in IMAGE_SUFFIXES for p in d.iterdir())


def prepare_jpeg(path: Path, long_side: int = 448, quality: int = 95) -> bytes:
    """JPEG bytes with the long side exactly `long_side`; a conforming RGB JPEG passes unchanged."""
    try:
        raw = path.read_bytes()
        with Image.open(io.BytesIO(raw)) as im:
            if im.format == "JPEG" and im.mode == "RGB" and max(im.size) == long_side:
                if not raw.rstrip(b"\x00").endswith(b"\xff\xd9"):
                    raise FrameError(f"{path}: truncated JPEG (no end marker)")
                return raw
            im.load()
            rgb = im.convert("RGB")
    except FrameError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        why = "not a recognised image file" if isinstance(e, UnidentifiedImageError) else str(e)
        raise FrameError(f"{path}: unreadable image ({why})") from e
    w, h = rgb.size
    scale = long_side / max(w, h)
    size = (long_side, max(1, round(h * scale))) if w >= h else (max(1, round(w * scale)), long_side)
    out = io.BytesIO()
    rgb.resize(size, Image.Resampling.LANCZOS).save(out, format="JPEG", quality=quality)
    return out.getvalue()


class FrameEncoder:
    """Data URLs of prepared frames, with a small LRU: neighbouring items often share a video."""

    def __init__(self, long_side: int = 448, quality: int = 95, cache_size: int = 256) -> None:
        self.long_side = long_side
        self.quality = quality
        self.cache_size = cache_size
        self._cache: OrderedDict[Path, str] = OrderedDict()

    def data_url(self, path: Path) -> str:
        url = self._cache.get(path)
        if url is not None:
            self._cache.move_to_end(path)
            return url
        url = "data:image/jpeg;base64," + base64.b64encode(prepare_jpeg(path, self.long_side, self.quality)).decode()
        self._cache[path] = url
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return url
