"""The inputs from the hub: the item table, the frame shards (verified, extracted), the two models.

huggingface_hub's snapshot_download does the transfer, so an interrupted fetch resumes (files
already there are skipped, a partial file continues), a pre-filled cache works with
HF_HUB_OFFLINE=1, and its progress bars show rate and ETA. `source` instead takes a folder that
already holds the dataset repos' files (a mirror, a shared disk): nothing is downloaded and the
folder is only read.
"""

from __future__ import annotations

import filecmp
import shutil
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import snapshot_download

from ..inputs.items import item_files, load_items
from ..inputs.shards import MANIFEST, extract
from ..protocol import Protocol

ITEMS_REPO = "GMLRVigil/BenchCheck-Pool"
FRAMES_REPO = "GMLRVigil/BenchCheck-Pool-Frames"
ITEM_PATTERNS = ["items/*.parquet", "items/*.csv", "items/*.jsonl"]
FRAME_PATTERNS = [MANIFEST, "frames_*.tar"]


@dataclass(frozen=True)
class Hub:
    """Where and how to reach the hub; the token is passed on, never shown."""

    token: str | None = None
    offline: bool = False


def _dataset(repo: str, local_dir: Path, patterns: list[str], hub: Hub) -> None:
    snapshot_download(
        repo, repo_type="dataset", local_dir=local_dir, allow_patterns=patterns, token=hub.token,
        local_files_only=hub.offline,
    )  # fmt: skip


def fetch_items(root: Path, hub: Hub, source: Path | None = None) -> int:
    """Item files into `<root>/items`; returns the number of valid items (the table is checked here)."""
    if source is None:
        _dataset(ITEMS_REPO, root, ITEM_PATTERNS, hub)
    else:
        files = item_files(source / "items")
        (root / "items").mkdir(parents=True, exist_ok=True)
        for f in files:
            dest = root / "items" / f.name
            if not dest.exists() or not filecmp.cmp(f, dest, shallow=False):
                shutil.copyfile(f, dest)
    return len(load_items(root / "items").items)


def fetch_frames(tar_dir: Path, frames_dir: Path, hub: Hub, source: Path | None = None) -> int:
    """Shards into `tar_dir` (or read from `source`), sha256-verified, extracted; returns n_videos."""
    if source is None:
        _dataset(FRAMES_REPO, tar_dir, FRAME_PATTERNS, hub)
    return extract(source or tar_dir, frames_dir)


def fetch_models(protocol: Protocol, hub: Hub) -> dict[str, str]:
    """Every step's model at its pinned revision into the hub cache (HF_HOME), where pool-launch finds it."""
    pinned = sorted({(s.model, s.revision) for s in protocol.steps.values()})
    return {
        f"{model}@{rev[:12]}": snapshot_download(model, revision=rev, token=hub.token, local_files_only=hub.offline)
        for model, rev in pinned
    }
