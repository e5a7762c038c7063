"""A synthetic package root in the seed's layout, deterministic from a seed.

`items/` (Parquet + CSV + JSONL parts), `frames/pool_frames/<video_id>/` (8..64 frames of varied
size and format, some `k:` videos, some missing folders), `frames_tar/` (tar shards and
`frames_manifest.json`), and the mark `SYNTHETIC.json`: its results are never sent to the real
dataset (`pool-pack` carries the mark, `pool-upload` refuses it). `build_root` makes a root whole or
not at all: written beside the target and renamed into place when complete. Gold answers and
per-benchmark difficulty agree with the simulated model (`sim.model`), so a simulated screen removes
known fractions per benchmark.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import random
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from ..errors import SetupError, folder_trouble
from ..hub.pack import SYNTHETIC
from ..inputs.shards import MANIFEST
from ..protocol import LETTERS
from ..sim.model import believed_option, blind_knowledge


@dataclass(frozen=True)
class Benchmark:
    name: str
    n_options: tuple[int, int]  # inclusive range
    band: tuple[float, float]  # blind-knowledge band of its questions


BENCHMARKS = (
    Benchmark("SynthNExTQA", (5, 5), (0.0, 1.0)),
    Benchmark("SynthEgoSchema", (5, 5), (0.1, 1.0)),
    Benchmark("SynthMVBench", (4, 4), (0.0, 0.95)),
    Benchmark("SynthTempCompass", (2, 2), (0.0, 1.0)),
    Benchmark("SynthVideoMME", (4, 4), (0.05, 1.0)),
    Benchmark("SynthPerception", (3, 3), (0.0, 1.0)),
    Benchmark("SynthLongVideo", (6, 10), (0.0, 1.0)),
    Benchmark("SynthTrulyVisual", (4, 4), (0.0, 0.3)),
    Benchmark("SynthBlindEasy", (4, 5), (0.93, 1.0)),
    Benchmark("SynthCausal", (4, 6), (0.15, 1.0)),
    Benchmark("SynthCounting", (4, 4), (0.0, 0.9)),
    Benchmark("SynthYesNo", (2, 2), (0.05, 1.0)),
)

SUBJECTS = (
    "the man in the red shirt",
    "the woman",
    "the child",
    "the dog",
    "the chef",
    "the driver",
    "the player",
    "the person on the left",
    "the cat",
    "the teacher",
    "the cyclist",
    "the robot arm",
)
ACTIONS = (
    ("opens", "open the door"),
    ("picks", "pick up the cup"),
    ("starts", "start running"),
    ("sits", "sit down"),
    ("turns", "turn off the light"),
    ("waves", "wave at the camera"),
    ("drops", "drop the ball"),
    ("enters", "enter the kitchen"),
    ("looks", "look at the phone"),
    ("claps", "clap"),
)
TEMPLATES = (
    "What does {s} do after {s2} {a}?",
    "Why does {s} {a0}?",
    "What happens right before {s} {a}?",
    "Where is {s} when {s2} {a}?",
    "How many times does {s} {a0}?",
    "What is {s} holding when {s2} {a}?",
)
ANSWERS = (
    "they leave the room",
    "they laugh",
    "a glass breaks",
    "on the sofa",
    "in the garden",
    "twice",
    "three times",
    "a red umbrella",
    "they pick up a book",
    "the lights turn on",
    "they wave back",
    "near the window",
    "a small box",
    "they start cooking",
    "once",
    "four times",
    "a blue bag",
    "they sit down",
    "at the table",
    "a phone",
    "they run outside",
    "next to the car",
    "a newspaper",
    "they close the door",
    "the music stops",
    "on the stairs",
    "a bicycle",
    "they shake hands",
)
PARTIAL = ".partial"  # <root>.partial (or <root>/.partial): a root being generated, put into place when complete
PARTIAL_MARK = ".pool-synth-partial"  # in <root>.partial while it is written: the folder is ours to remove
T = TypeVar("T")
FRAME_FORMATS = (("jpeg448", 0.5), ("jpegbig", 0.3), ("png", 0.2))
MAX_LINKS = 50_000  # with link_frames, videos sharing one video's frames (ext4 allows 65,000 links)


@dataclass(frozen=True)
class SynthConfig:
    n_items: int = 2000
    n_videos: int = 300
    seed: int = 0
    k_fraction: float = 0.3  # videos not downloaded in this snapshot (video_id "k:...")
    missing_fraction: float = 0.05  # videos whose frame folder is absent
    frames: tuple[int, int] = (8, 64)
    shard_videos: int = 100
    bad_items: bool = False  # add a file of invalid items (one per validation rule)
    corrupt_frames: int = 0  # frames overwritten with garbage or truncated
    items_per_video: int = 0  # 0: each item picks a video at random (the real pool has ~2.7 per video)
    frame_formats: tuple[tuple[str, float], ...] = FRAME_FORMATS  # (format, weight); benchmarks may want real-like
    n_benchmarks: int = len(BENCHMARKS)  # more than BENCHMARKS: their kinds again under new names (the pool has 139)
    link_frames: bool = False  # frames hard-linked to one video's per format: folders at size cost no disk
    shards: bool = True  # the tar shards of every frame folder (frames_tar/)


@dataclass(frozen=True)
class SynthSummary:
    n_items: int
    n_videos_with_frames: int
    n_frames: int
    n_shards: int


def question_in_band(rng: random.Random, band: tuple[float, float]) -> str:
    for _ in range(10_000):
        subject, subject2 = rng.sample(SUBJECTS, 2)
        third, base = rng.choice(ACTIONS)
        action = third + base[len(third) - 1 :] if " " in base else third
        q = rng.choice(TEMPLATES).format(s=subject, s2=subject2, a=action, a0=base)
        q = q[0].upper() + q[1:] + (f" (scene {rng.randrange(1000)})" if rng.random() < 0.7 else "")
        if band[0] <= blind_knowledge(q) < band[1]:
            return q
    raise RuntimeError(f"no question found in band {band}")


def _video_base(rng: random.Random, fmt: str, portrait: bool) -> Image.Image:
    # jpeg448: 448 px wide, 16:9 or 4:3 at random; jpeg448sq and jpeg448wide: one shape, for a benchmark's frame size
    fixed = {"jpeg448sq": (448, 448), "jpeg448wide": (448, 252), "jpegbig": (854, 480), "png": (640, 360)}
    size = (448, rng.choice((252, 336))) if fmt == "jpeg448" else fixed[fmt]
    if portrait:
        size = (size[1], size[0])
    small = Image.new("RGB", (16, 9) if not portrait else (9, 16), tuple(rng.randrange(256) for _ in range(3)))
    small.putpixel((3, 3), (255, 255, 255))
    return small.resize(size, Image.Resampling.BILINEAR)


def _frame_bytes(base: Image.Image, fmt: str, i: int) -> tuple[bytes, str]:
    """The video's base picture with a moving marker, so frames differ and encode fast."""
    im = base.copy()
    x = (i * 23) % max(1, im.width - 24)
    im.paste((255, 255 - (i * 7) % 256, 0), (x, 4, x + 20, 24))
    out = io.BytesIO()
    if fmt == "png":
        im.save(out, format="PNG", compress_level=1)
        return out.getvalue(), ".png"
    im.save(out, format="JPEG", quality=85)
    return out.getvalue(), ".jpg"


def _write_frames(cfg: SynthConfig, rng: random.Random, frames_dir: Path, videos: list[str]) -> int:
    n_frames = 0
    weights = [w for _, w in cfg.frame_formats]
    first: dict[str, list[Path]] = {}  # with link_frames: per format, the frames written so far
    for v in videos:
        d = frames_dir / v
        d.mkdir(parents=True)
        fmt = rng.choices([f for f, _ in cfg.frame_formats], weights)[0]
        base = _video_base(rng, fmt, rng.random() < 0.1)
        n = rng.randint(*cfg.frames)
        padded = rng.random() < 0.5
        src = first.setdefault(fmt, [])
        if len(src) and src[0].stat().st_nlink >= MAX_LINKS:  # ext4 allows 65,000 links to a file
            src = first[fmt] = []
        for i in range(n):
            if cfg.link_frames and i < len(src):
                (d / f"frame_{i:04d}{src[i].suffix}" if padded else d / f"frame_{i}{src[i].suffix}").hardlink_to(src[i])
                continue
            data, suffix = _frame_bytes(base, fmt, i)
            name = f"frame_{i:04d}{suffix}" if padded else f"frame_{i}{suffix}"
            (d / name).write_bytes(data)
            src.append(d / name)
        if rng.random() < 0.2:
            (d / "info.txt").write_text("not a frame\n")
        n_frames += n
    return n_frames


def _write_shards(frames_dir: Path, tar_dir: Path, videos: list[str], per_shard: int) -> int:
    tar_dir.mkdir(parents=True)
    shards = []
    for start in range(0, len(videos), per_shard):
        name = f"frames_{start // per_shard:03d}.tar"
        with tarfile.open(tar_dir / name, "w") as tf:
            for v in videos[start : start + per_shard]:
                tf.add(frames_dir / v, arcname=v)
        digest = hashlib.sha256((tar_dir / name).read_bytes()).hexdigest()
        shards.append({"file": name, "sha256": digest, "bytes": (tar_dir / name).stat().st_size})
    (tar_dir / MANIFEST).write_text(json.dumps({"shards": shards, "n_videos": len(videos)}, indent=1))
    return len(shards)


def _bad_rows() -> list[dict[str, object]]:
    ok = {"benchmark": "SynthBad", "video_id": "vbad", "question": "Is it?", "options": ["yes", "no"], "answer": "A"}
    return [
        {**ok, "item_id": "bad-dup"},
        {**ok, "item_id": "bad-dup"},
        {**ok, "item_id": "bad-one-option", "options": ["only"]},
        {**ok, "item_id": "bad-27-options", "options": [f"o{i}" for i in range(27)]},
        {**ok, "item_id": "bad-empty-question", "question": "  "},
        {**ok, "item_id": "bad-empty-option", "options": ["yes", ""]},
        {**ok, "item_id": "bad-gold-letter", "answer": "C"},
        {**ok, "item_id": "bad-gold-index", "answer": "7"},
        {**ok, "item_id": "bad-video-dotdot", "video_id": "../etc"},
        {**ok, "item_id": "bad-video-abs", "video_id": "/etc/passwd"},
        {**ok, "item_id": "bad-video-sep", "video_id": "a/b"},
        {**ok, "item_id": "bad-video-nul", "video_id": "v\x00x"},
    ]


def generate(root: Path, cfg: SynthConfig = SynthConfig()) -> SynthSummary:
    """Write a fresh package root; refuses a folder that already holds items."""
    items_dir, frames_dir, tar_dir = root / "items", root / "frames" / "pool_frames", root / "frames_tar"
    if items_dir.exists():
        raise FileExistsError(f"{items_dir} exists: generate into a new root")
    rng = random.Random(cfg.seed)
    kinds = [(BENCHMARKS[b % len(BENCHMARKS)], b // len(BENCHMARKS)) for b in range(cfg.n_benchmarks)]
    names = [k.name + (f"{n:02d}" if n else "") for k, n in kinds]
    videos: list[tuple[str, int]] = []  # (video_id, benchmark index)
    for i in range(cfg.n_videos):
        b = i % cfg.n_benchmarks
        vid = (
            f"k:yt{rng.getrandbits(40):010x}" if rng.random() < cfg.k_fraction else f"v{i:05d}_{names[b][5:9].lower()}"
        )
        videos.append((vid, b))
    rows: dict[str, list[object]] = {
        k: [] for k in ("item_id", "benchmark", "video_id", "question", "options", "answer")
    }
    for i in range(cfg.n_items):
        vid, b = videos[i // cfg.items_per_video % len(videos) if cfg.items_per_video else rng.randrange(len(videos))]
        bench, name = kinds[b][0], names[b]
        q = question_in_band(rng, bench.band)
        n = rng.randint(*bench.n_options)
        options = ["yes", "no"] if n == 2 and rng.random() < 0.8 else rng.sample(ANSWERS, n)
        if n == 2 and rng.random() < 0.5:
            options.reverse()
        gold = believed_option(q, options)
        for k, v in (
            ("item_id", f"{name[5:].lower()}-{i:06d}"),
            ("benchmark", name),
            ("video_id", vid),
            ("question", q),
            ("options", options),
            ("answer", LETTERS[gold]),
        ):
            rows[k].append(v)
    items_dir.mkdir(parents=True)
    table = pa.table(rows)
    cut1, cut2 = int(cfg.n_items * 0.8), int(cfg.n_items * 0.9)
    pq.write_table(table.slice(0, cut1), items_dir / "pool_items.parquet")
    csv_part = table.slice(cut1, cut2 - cut1).to_pylist()
    _write_csv(items_dir / "pool_items_extra.csv", csv_part)
    with (items_dir / "pool_items_late.jsonl").open("w") as f:
        for r in table.slice(cut2).to_pylist():
            r["answer"] = LETTERS.index(str(r["answer"]))  # index form of the gold answer
            f.write(json.dumps(r) + "\n")
    if cfg.bad_items:
        with (items_dir / "bad_items.jsonl").open("w") as f:
            for r in _bad_rows():
                f.write(json.dumps(r) + "\n")
    with_frames = [v for v, _ in videos if not v.startswith("k:") and rng.random() >= cfg.missing_fraction]
    with_frames = sorted(set(with_frames))
    n_frames = _write_frames(cfg, rng, frames_dir, with_frames)
    n_shards = _write_shards(frames_dir, tar_dir, with_frames, cfg.shard_videos) if cfg.shards else 0
    _corrupt(rng, frames_dir, with_frames, cfg.corrupt_frames)
    (root / "results" / "pool").mkdir(parents=True)
    (root / "logs").mkdir()
    mark = {"synthetic": True, "why": "made by pool-synth: its results must never reach the real dataset",
            "items": cfg.n_items, "videos": cfg.n_videos, "seed": cfg.seed}  # fmt: skip
    (root / SYNTHETIC).write_text(json.dumps(mark, indent=1) + "\n")
    return SynthSummary(cfg.n_items, len(with_frames), n_frames, n_shards)


def staging(root: Path) -> Path:
    """Where `build_root` writes `root`: `<root>.partial` beside it, or `<root>/.partial` inside a folder that
    is already there (a volume's mount point, say, which no rename can replace)."""
    return root / PARTIAL if root.is_dir() else root.with_name(root.name + PARTIAL)


def build_root(root: Path, make: Callable[[Path], T], say: Callable[[str], None] = print) -> T:
    """`make(folder)` writes a package root into `staging(root)`, which becomes `root` once `make` returned: an
    interrupted run (Ctrl-C, a full disk, a kill) leaves no `root` that looks usable, only the staging folder,
    which the next run names in one line and removes (it holds our mark, so it is ours; one without it is
    refused, never deleted). Beside `root` it is renamed into place; inside an empty `root` its entries are
    moved up, `items/` last (a root is a pool once it has items). Links and paths inside are relative to the
    root, so either keeps them valid. SetupError (one line) for a `root` that is there and not an empty
    folder."""
    partial = staging(root)
    if root.exists() and not (root.is_dir() and all(p == partial for p in root.iterdir())):
        what = "a package root" if (root / "items").exists() else "not an empty folder"
        raise SetupError(f"{root} exists ({what}): generate into a new root")
    if partial.exists() or partial.is_symlink():
        if not (partial / PARTIAL_MARK).is_file():
            raise SetupError(f"{partial} is in the way and was not left by pool-synth: move or delete it")
        say(f"removing {partial}: a pool left half-made by an interrupted run")
        shutil.rmtree(partial)
    try:
        partial.mkdir(parents=True)
        (partial / PARTIAL_MARK).write_text("a package root being generated; put into place when complete\n")
    except OSError as e:  # a file on the way, a read-only disk: named in words, before anything is generated
        raise SetupError(f"root {root} {folder_trouble(root, e)}: choose another root") from None
    made = make(partial)
    (partial / PARTIAL_MARK).unlink()
    if partial.parent == root:
        for entry in sorted(partial.iterdir(), key=lambda p: p.name == "items"):
            entry.rename(root / entry.name)
        partial.rmdir()
    else:
        partial.replace(root)
    return made


def _write_csv(path: Path, rows: list[dict[str, object]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["item_id", "benchmark", "video_id", "question", "options", "answer"])
        w.writeheader()
        for r in rows:
            w.writerow({**r, "options": json.dumps(r["options"])})


def _corrupt(rng: random.Random, frames_dir: Path, videos: list[str], n: int) -> None:
    """After the shards are written, so extraction tests stay clean; only the cache is damaged."""
    for k, v in enumerate(rng.sample(videos, min(n, len(videos)))):
        files = sorted((frames_dir / v).iterdir())
        for f in files:
            if f.suffix in (".jpg", ".png"):
                f.write_bytes(b"garbage, not an image" if k % 2 == 0 else f.read_bytes()[:200])
