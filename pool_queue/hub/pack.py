"""The return tarball of the run package (section 8): results/pool/step1..3 and logs, plus its sha256.

Members keep the run package's names (`results/pool/stepN/...`, `logs/...`) wherever the results
root really lives, so the receiving side unpacks the layout it knows. The store's rebuildable
indexes (this release's and earlier ones') are left out. The tarball is written under a temporary
name and renamed when complete, so a crash never leaves a file that looks finished; the `.sha256`
line is `sha256sum` format.

A root made by `pool-synth` or `pool-demo` holds the mark `SYNTHETIC.json`: its results are made up. The
pack carries it as its first member, where `pool-upload` looks before sending anything.
"""

from __future__ import annotations

import socket
import tarfile
from datetime import date
from pathlib import Path

from ..inputs.shards import sha256_file
from ..proc.progress import byte_progress
from ..store.segment_index import INDEX_DIR_PREFIX
from .fetch import ITEMS_REPO

SYNTHETIC = "SYNTHETIC.json"  # in a generated root, and first in its pack: its results never reach the dataset


def pack_name(host: str | None = None, day: date | None = None) -> str:
    return f"pool_returns_{host or socket.gethostname()}_{(day or date.today()):%Y%m%d}"


def _members(results: Path, logs: Path, steps: list[int]) -> list[tuple[Path, str]]:
    out = []
    for step in (f"step{n}" for n in steps):
        for p in sorted((results / step).rglob("*")) if (results / step).is_dir() else []:
            rel = p.relative_to(results / step)
            if p.is_file() and not any(part.startswith(INDEX_DIR_PREFIX) for part in rel.parts):
                out.append((p, f"results/pool/{step}/{rel}"))
    for p in sorted(logs.rglob("*")) if logs.is_dir() else []:
        if p.is_file():
            out.append((p, f"logs/{p.relative_to(logs)}"))
    return out


def pack(
    results: Path, logs: Path, steps: list[int], out_dir: Path, name: str, show: bool = True, root: Path | None = None
) -> tuple[Path, Path]:
    """Write `<name>.tar.gz` and `<name>.sha256` into out_dir (the rows of `steps`); returns both paths.
    The package `root`'s synthetic mark, when it has one, goes first."""
    members = _members(results, logs, steps)
    if not any(arc.startswith("results/") for _, arc in members):
        raise FileNotFoundError(f"no step rows under {results}: nothing to pack")
    if root is not None and (root / SYNTHETIC).is_file():
        members.insert(0, (root / SYNTHETIC, SYNTHETIC))
    out_dir.mkdir(parents=True, exist_ok=True)
    tar_path, sha_path = out_dir / f"{name}.tar.gz", out_dir / f"{name}.sha256"
    partial = tar_path.with_name(tar_path.name + ".partial")
    total = sum(p.stat().st_size for p, _ in members)
    with byte_progress("pack", total, show) as advance, tarfile.open(partial, "w:gz", compresslevel=6) as tf:
        for path, arc in members:
            tf.add(path, arcname=arc, recursive=False)
            advance(path.stat().st_size)
    partial.replace(tar_path)
    sha_path.write_text(f"{sha256_file(tar_path)}  {tar_path.name}\n")
    return tar_path, sha_path


def is_synthetic(tar_path: Path) -> bool:
    """Whether a pack holds the synthetic mark: its first member, so only the tarball's start is read.
    ValueError for a file that is no gzipped tar."""
    try:
        with tarfile.open(tar_path, "r:gz") as tf:
            first = tf.next()
    except (tarfile.TarError, OSError, EOFError) as e:
        raise ValueError(f"{tar_path.name} is not a pack (a gzipped tar) that pool-pack writes: {e}") from None
    return first is not None and first.name == SYNTHETIC


def upload_hint(tar_path: Path) -> str:
    """What pool-upload will do with this pack, told from the pack as pool-upload tells it (`is_synthetic`):
    the command that sends it, or, for a synthetic pack, that it is refused and the one command that sends it
    anyway, to a test repo."""
    if is_synthetic(tar_path):
        return (f"synthetic: the pack carries {SYNTHETIC} (a root made by pool-synth or pool-demo), so pool-upload "
                f"refuses to send it to {ITEMS_REPO}; to try the upload itself: pool-upload --synthetic-ok --repo "
                f"<your test repo> {tar_path}")  # fmt: skip
    return f"send it: pool-upload {tar_path}"


def check_sha(tar_path: Path, sha_path: Path) -> None:
    """Raise ValueError when the tarball does not match its .sha256 line (changed or torn since packing)."""
    want, _, fname = sha_path.read_text().strip().partition("  ")
    if fname != tar_path.name:
        raise ValueError(f"{sha_path} is for {fname!r}, not {tar_path.name}")
    if sha256_file(tar_path) != want:
        raise ValueError(f"{tar_path.name} does not match {sha_path.name}: pack again")
