"""Frame tar shards: verify `frames_manifest.json` (sha256 per shard, n_videos) and extract.

A shard whose checksum differs is refused before anything of it is unpacked; extraction uses
tarfile's "data" filter, so a member cannot write outside the cache. Extracted shards are recorded
beside the cache (`.<cache name>.extracted.json`, by checksum; the cache itself holds only video
folders), so an interrupted extraction resumes.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from ..errors import ShardError
from ..proc.progress import byte_progress

MANIFEST = "frames_manifest.json"


class Shard(BaseModel):
    file: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int | None = None


class Manifest(BaseModel):
    shards: list[Shard]
    n_videos: int


def read_manifest(tar_dir: Path) -> Manifest:
    path = tar_dir / MANIFEST
    if not path.is_file():
        raise ShardError(f"{path} not found")
    try:
        manifest = Manifest.model_validate_json(path.read_text(encoding="utf-8"))
    except ValidationError as e:  # cut short or edited: one line naming the file, not pydantic's report
        first = e.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise ShardError(f"{path}: {'not valid JSON' if first['type'] == 'json_invalid' else where} ({first['msg']}); "
                         "fetch it again with its shards (pool-fetch --frames)") from None  # fmt: skip
    for shard in manifest.shards:
        if "/" in shard.file or "\\" in shard.file or shard.file.startswith("."):
            raise ShardError(f"{path}: shard name {shard.file!r} is not a plain file name")
    return manifest


def sha256_file(path: Path, advance: object = None) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            if callable(advance):
                advance(len(chunk))
    return h.hexdigest()


def verify(tar_dir: Path, manifest: Manifest | None = None, show: bool = True) -> Manifest:
    """Raise ShardError naming every missing or mismatching shard."""
    manifest = manifest or read_manifest(tar_dir)
    missing = [s.file for s in manifest.shards if not (tar_dir / s.file).is_file()]
    if missing:
        raise ShardError(f"missing shard(s) in {tar_dir}: {', '.join(missing)}")
    total = sum((tar_dir / s.file).stat().st_size for s in manifest.shards)
    bad = []
    with byte_progress("verify sha256", total, show) as advance:
        for shard in manifest.shards:
            if sha256_file(tar_dir / shard.file, advance) != shard.sha256:
                bad.append(shard.file)
    if bad:
        raise ShardError(f"SHA256 MISMATCH: {', '.join(bad)} (re-download these shards)")
    return manifest


def extract(tar_dir: Path, frames_dir: Path, show: bool = True) -> int:
    """Verify, then unpack every shard into the cache; returns the number of video folders there."""
    manifest = verify(tar_dir, show=show)
    frames_dir.mkdir(parents=True, exist_ok=True)
    marker = frames_dir.parent / f".{frames_dir.name}.extracted.json"
    done = _extracted(marker)
    todo = [s for s in manifest.shards if s.sha256 not in done]
    n = _unpack(tar_dir, frames_dir, todo, marker, done, show)
    if n != manifest.n_videos and len(todo) < len(manifest.shards):  # folders went missing since: unpack all again
        done.clear()
        n = _unpack(tar_dir, frames_dir, manifest.shards, marker, done, show)
    if n != manifest.n_videos:
        raise ShardError(f"{frames_dir} holds {n} video folders, manifest says n_videos={manifest.n_videos}")
    return n


def _extracted(marker: Path) -> set[str]:
    """The checksums of the shards already unpacked; a record that does not read (cut by a crash, edited) counts
    as none: every shard is unpacked again, which only costs time."""
    try:
        found = json.loads(marker.read_text())
    except (OSError, ValueError):
        return set()
    return {s for s in found if isinstance(s, str)} if isinstance(found, list) else set()


def _unpack(tar_dir: Path, frames_dir: Path, shards: list[Shard], marker: Path, done: set[str], show: bool) -> int:
    """Extract verified shards, recording each in `marker` once complete; returns the video folder count."""
    with byte_progress("extract", sum((tar_dir / s.file).stat().st_size for s in shards), show) as advance:
        for shard in shards:
            with tarfile.open(tar_dir / shard.file) as tf:
                tf.extractall(frames_dir, filter="data")
            done.add(shard.sha256)
            tmp = marker.with_suffix(".tmp")
            tmp.write_text(json.dumps(sorted(done)))
            tmp.replace(marker)
            advance((tar_dir / shard.file).stat().st_size)
    return video_folder_count(frames_dir)


def video_folder_count(frames_dir: Path) -> int:
    """The folders in the cache, as the manifest's `n_videos` counts them (links to folders included; a link
    that loops or leads nowhere is no folder)."""
    return sum(1 for p in frames_dir.iterdir() if p.is_dir())
