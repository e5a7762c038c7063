"""Send a packed return to the dataset repo under `returns/` (the run package's section 8)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import HfApi

from .fetch import ITEMS_REPO
from .pack import check_sha

RETURNS = "returns"


@dataclass(frozen=True)
class Transfer:
    local: Path
    remote: str  # path in the repo


def plan_upload(tar_path: Path, sha_path: Path) -> list[Transfer]:
    """Both files, checked against each other first: a tarball changed since packing is not sent."""
    check_sha(tar_path, sha_path)
    return [Transfer(p, f"{RETURNS}/{p.name}") for p in (tar_path, sha_path)]


def upload(transfers: list[Transfer], token: str, repo: str = ITEMS_REPO) -> list[str]:
    """The tarball first, its checksum last: a `.sha256` on the hub means its tarball is there too."""
    api = HfApi(token=token)
    return [
        str(
            api.upload_file(
                path_or_fileobj=str(t.local),
                path_in_repo=t.remote,
                repo_id=repo,
                repo_type="dataset",
                commit_message=f"pool return: {t.local.name}",
            )
        )
        for t in transfers
    ]
