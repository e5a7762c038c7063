"""pool-upload: send a packed return and its .sha256 to the dataset repo under returns/.

The token comes from HF_TOKEN (a write token for the repo) and is never printed. --dry-run shows
what would go where and sends nothing. Without a token, send both files by any file transfer.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from huggingface_hub.errors import HfHubHTTPError

from ..cli import fail, reports_errors
from ..fetch import ITEMS_REPO
from ..settings import load_settings
from ..upload import plan_upload, upload


@reports_errors
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="pool-upload", description=__doc__)
    p.add_argument("tarball", type=Path, help="pool_returns_<host>_<date>.tar.gz (its .sha256 beside it)")
    p.add_argument("--repo", default=ITEMS_REPO, help="dataset repo (default %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="print what would be uploaded where")
    a = p.parse_args(argv)
    tar_path: Path = a.tarball
    sha_path = tar_path.with_name(tar_path.name.removesuffix(".tar.gz") + ".sha256")
    for f in (tar_path, sha_path):
        if not f.is_file():
            fail(f"{f} not found (pool-pack writes both)")
    try:
        transfers = plan_upload(tar_path, sha_path)
    except ValueError as e:
        fail(str(e))
    for t in transfers:
        print(
            f"{'would upload' if a.dry_run else 'upload'} {t.local} ({t.local.stat().st_size:,} B) -> "
            f"dataset {a.repo}: {t.remote}"
        )
    if a.dry_run:
        return
    token = load_settings().hf_token
    if token is None:
        fail("HF_TOKEN is not set: a write token for the repo is needed (or send the files by any transfer)")
    try:
        urls = upload(transfers, token.get_secret_value(), a.repo)
    except HfHubHTTPError as e:
        fail(f"the hub refused the upload: {e}")
    for u in urls:
        print(f"uploaded: {u}")


if __name__ == "__main__":
    main()
