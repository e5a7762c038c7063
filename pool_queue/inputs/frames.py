"""The frame cache `frames/pool_frames/<video_id>/`: which videos have frames, listing, 448-px JPEGs.

One rule decides whether a video has a frame folder (`video_folder`), for the planner, the worker,
status and audit alike. A `video_id` is used only after a check that it is a plain name, and links
must resolve inside the cache: no item can make a worker read outside it. No name in the cache can
make a listing raise: a folder whose name is not valid UTF-8 (no item can name it), a link that loops
or leads nowhere, an unreadable entry: each is "no usable frames" with a reason, or is skipped.
"""

from __future__ import annotations

import base64
import io
import os
import re
import time
import unicodedata
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from PIL import Image, ImageOps, UnidentifiedImageError

from ..errors import FrameError
from ..text import is_utf8, printable

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
MAX_ASPECT = 200  # Qwen-VL's image processor refuses a longer side over 200 times the shorter one
DEFAULT_MAX_PIXELS = 50_000_000  # a frame larger than this is refused before it is decoded
ORIENTATION = 0x0112  # the EXIF tag viewers rotate by
_DIGITS = re.compile(r"([0-9]+)")  # ASCII digits only: int() of any match succeeds


def natural_key(name: str) -> tuple[tuple[tuple[int, int | str], ...], str]:
    """frame_2 before frame_10; total over any names (ties broken by the name itself)."""
    return tuple((0, int(p)) if p.isdigit() and p.isascii() else (1, p) for p in _DIGITS.split(name) if p), name


def video_folder(frames_dir: Path, video_id: str) -> tuple[Path | None, str]:
    """The one rule for "this video has a frame folder", used by the planner, worker, status and
    audit: (folder, "") or (None, why not). Never raises; never leaves the frame cache."""
    if why := _name_problem(video_id):
        return None, why
    d = frames_dir / video_id
    try:
        if not d.exists() and not d.is_symlink() and (twin := _form_twin(frames_dir, video_id)) is not None:
            d = twin
        if d.is_symlink() and not d.resolve().is_relative_to(frames_dir.resolve()):
            return None, f"video folder {video_id!r} is a link leading outside the frame cache"
        if not d.is_dir():
            return None, f"no frame folder for video {video_id!r} in {frames_dir}"
    except OSError as e:  # a name too long for the filesystem, no permission
        return None, f"frame folder of video {video_id[:80]!r} is unreadable ({e.strerror or e})"
    except RuntimeError:  # Python 3.11's resolve() on a loop of links
        return None, f"frame folder of video {video_id[:80]!r} is a loop of links"
    return d, ""


def other_forms(name: str) -> list[str]:
    """The spellings of `name` in the other Unicode normalization form: its NFD for an NFC name, its NFC
    for an NFD one, none for an ASCII name or one in neither form. A video_id in NFC and its folder in
    NFD (as a tar made on macOS writes names) render the same: one is found by the other."""
    if name.isascii():
        return []
    forms = [unicodedata.normalize(f, name) for f in ("NFC", "NFD")]
    return [f for f in forms if f != name] if name in forms else []


def _form_twin(frames_dir: Path, video_id: str) -> Path | None:
    """The folder named `video_id` in its other Unicode form, when there is no folder of its exact name."""
    for other in other_forms(video_id):
        if (frames_dir / other).is_dir():
            return frames_dir / other
    return None


def _name_problem(video_id: str) -> str:
    """Why a video_id cannot name a frame folder, from the name alone ("" when it can)."""
    if not is_utf8(video_id):
        return f"video folder {printable(video_id)!r}: its name is not valid UTF-8"
    if video_id.startswith("k:"):
        return f"video {video_id!r} is not downloaded (k: id)"
    if not video_id or video_id in (".", "..") or any(c in video_id for c in "/\\\x00") or ".." in video_id:
        return f"unsafe video_id {video_id!r}"
    if video_id.startswith("."):
        return f"video folder {video_id!r} is hidden"
    return ""


_listed: dict[Path, tuple[tuple[int, int], pa.Array]] = {}  # frames_dir -> ((inode, mtime), its frame_videos)


def frame_videos(frames_dir: Path) -> pa.Array:
    """Names of the video folders in the cache that pass `video_folder`: one listing, a plain folder taken
    from its directory entry and only links checked further (67,021 folders in the real pool). Kept
    while the cache's own mtime stands (a folder added, removed or replaced changes it; one changed
    within the last 2 s is listed again, for coarse clocks), so a status refresh or a plan that asks
    several times lists once."""
    try:
        st = frames_dir.stat()
        key = (st.st_ino, st.st_mtime_ns)
        if (memo := _listed.get(frames_dir)) is not None and memo[0] == key:
            return memo[1]
        with os.scandir(frames_dir) as it:
            entries = list(it)
        names = [e.name for e in entries if _name_problem(e.name) == "" and (
            e.is_dir(follow_symlinks=False) or video_folder(frames_dir, e.name)[0] is not None)]  # fmt: skip
    except OSError:  # no cache (yet), or one we may not read: no video has frames
        return pa.array([], pa.string())
    present = {e.name for e in entries}  # a name that is there is matched as itself, never as a twin
    names += [o for n in names for o in other_forms(n) if o not in present and _name_problem(o) == ""]
    found = pa.array(names, pa.string())
    if time.time() - st.st_mtime > 2.0:
        _listed[frames_dir] = (key, found)
    return found


def unicode_form_twins(video_ids: pa.Array | pa.ChunkedArray, frames_dir: Path) -> pa.Table:
    """(video_id, folder): items' videos with no frame folder, while a folder's name differs from the id
    only by Unicode normalization and is not its other form (`other_forms`: an NFC id and an NFD folder,
    as a tar made on macOS writes it, are matched everywhere and never listed here), e.g. a name mixing
    both forms. Both render the same, yet the id is not matched to it: the pair is named for the user,
    who renames the folder to the items' spelling (or re-extracts); the package root is never renamed.
    Column operations over the unique ids and one listing."""
    folders = frame_videos(frames_dir)
    ids = pc.unique(video_ids.combine_chunks() if isinstance(video_ids, pa.ChunkedArray) else video_ids)
    lost = pc.filter(ids, pc.invert(pc.fill_null(pc.is_in(ids, value_set=folders), False)))
    if not len(lost) or not len(folders):
        return pa.table({"video_id": pa.array([], pa.string()), "folder": pa.array([], pa.string())})
    by_id = pa.table({"key": pc.utf8_normalize(lost, form="NFC"), "video_id": lost})
    by_folder = pa.table({"key": pc.utf8_normalize(folders, form="NFC"), "folder": folders})
    pairs = by_id.join(by_folder, "key", join_type="inner").select(["video_id", "folder"])
    real = [os.path.lexists(frames_dir / f) for f in pairs.column("folder").to_pylist()]  # not a spelling of one
    return pairs.filter(pa.array(real, pa.bool_())).sort_by([("video_id", "ascending"), ("folder", "ascending")])


def list_frames(folder: Path, frames_dir: Path | None = None) -> list[Path]:
    """Usable frames of a folder in natural order: image files, not hidden (`.x`, macOS `._x`), and
    (for links) resolving inside the frame cache."""
    inside = (frames_dir or folder.parent).resolve()
    out = []
    for p in folder.iterdir():
        if p.name.startswith(".") or p.suffix.lower() not in IMAGE_SUFFIXES:
            continue
        try:
            if not p.is_file() or (p.is_symlink() and not p.resolve().is_relative_to(inside)):
                continue
        except (OSError, RuntimeError):  # unreadable, or a loop of links
            continue
        out.append(p)
    return sorted(out, key=lambda p: natural_key(p.name))


def find_frames(frames_dir: Path, video_id: str) -> list[Path]:
    """A video's usable frames; FrameError naming the folder and the reason when there are none."""
    folder, why = video_folder(frames_dir, video_id)
    if folder is None:
        raise FrameError(why)
    name = printable(str(folder))
    try:
        frames = list_frames(folder, frames_dir)
    except (OSError, RuntimeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise FrameError(f"{name}: unreadable frame folder ({why})") from e
    if not frames:
        raise FrameError(f"{name}: no usable frames (image files, not hidden, inside the frame cache)")
    return frames


def _to_rgb(im: Image.Image) -> Image.Image:
    """8-bit RGB; 16- and 32-bit greys are scaled to 8 bits, not clipped (which turns them white)."""
    if im.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        pixels = np.asarray(im).astype(np.float64)
        top = (
            1.0
            if im.mode == "F" and pixels.max(initial=0) <= 1.0
            else 255.0
            if pixels.max(initial=0) <= 255
            else 65535.0
        )
        pixels = np.clip(np.rint(pixels * 255.0 / top), 0, 255).astype(np.uint8)
        return Image.fromarray(pixels, "L").convert("RGB")
    return im.convert("RGB")


def served_size(w: int, h: int, long_side: int = 448) -> tuple[int, int]:
    """The size a w x h frame is served at: its long side `long_side`, its aspect kept."""
    scale = long_side / max(w, h)
    return (long_side, max(1, round(h * scale))) if w >= h else (max(1, round(w * scale)), long_side)


def sample_sizes(frames_dir: Path, videos: int) -> list[tuple[int, int]]:
    """The pixel sizes of the first frame of up to `videos` video folders (headers only, nothing decoded);
    empty when the cache has no readable frame folder."""
    out: list[tuple[int, int]] = []
    try:
        entries = os.scandir(frames_dir)
    except OSError:
        return out
    with entries:
        for e in entries:
            if len(out) >= videos:
                break
            try:
                frames = list_frames(Path(e.path), frames_dir) if e.is_dir() else []
                if frames:
                    with Image.open(frames[0]) as im:
                        out.append(im.size)
            except (OSError, RuntimeError, UnidentifiedImageError, Image.DecompressionBombError):
                continue
    return out


def prepare_jpeg(path: Path, long_side: int = 448, quality: int = 95, max_pixels: int = DEFAULT_MAX_PIXELS) -> bytes:
    """JPEG bytes with the long side exactly `long_side`, upright (EXIF orientation applied, as viewers
    show it); a conforming upright RGB JPEG passes unchanged. A frame that is unreadable, larger than
    `max_pixels`, or too elongated for the model is a FrameError naming it."""
    name = printable(str(path))
    try:
        raw = path.read_bytes()
        with Image.open(io.BytesIO(raw)) as im:
            w, h = im.size
            if w * h > max_pixels:
                raise FrameError(f"{name}: {w}x{h} pixels, over the limit of {max_pixels:,} (POOL_MAX_FRAME_PIXELS)")
            if min(w, h) < 1 or max(w, h) / min(w, h) > MAX_ASPECT:
                raise FrameError(f"{name}: {w}x{h}: aspect ratio over {MAX_ASPECT} (the model refuses it)")
            upright = im.getexif().get(ORIENTATION, 1) in (0, 1)
            if im.format == "JPEG" and im.mode == "RGB" and max(im.size) == long_side and upright:
                if raw.rstrip(b"\x00").endswith(b"\xff\xd9"):
                    return raw
                im.load()  # bytes after the end marker (as cameras write) decode; a cut file raises here
                return raw
            im.load()
            rgb = _to_rgb(ImageOps.exif_transpose(im))
    except FrameError:
        raise
    except Image.DecompressionBombError as e:
        raise FrameError(f"{name}: over the limit of pixels Pillow decodes (a decompression bomb: {e})") from e
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        why = "not a recognised image file" if isinstance(e, UnidentifiedImageError) else str(e)
        raise FrameError(f"{name}: unreadable image ({printable(why)})") from e
    out = io.BytesIO()
    rgb.resize(served_size(*rgb.size, long_side), Image.Resampling.LANCZOS).save(out, format="JPEG", quality=quality)
    return out.getvalue()


class FrameEncoder:
    """Data URLs of prepared frames, with a small LRU: neighbouring items often share a video."""

    def __init__(
        self, long_side: int = 448, quality: int = 95, cache_size: int = 256, max_pixels: int = DEFAULT_MAX_PIXELS
    ) -> None:
        self.long_side = long_side
        self.quality = quality
        self.max_pixels = max_pixels
        self.cache_size = cache_size
        self._cache: OrderedDict[Path, str] = OrderedDict()

    def data_url(self, path: Path) -> str:
        url = self._cache.get(path)
        if url is not None:
            self._cache.move_to_end(path)
            return url
        jpeg = prepare_jpeg(path, self.long_side, self.quality, self.max_pixels)
        url = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()
        self._cache[path] = url
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return url
