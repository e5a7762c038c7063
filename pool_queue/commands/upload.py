"""pool-upload: send a packed return and its .sha256 to the dataset repo under returns/.

The token comes from HF_TOKEN (a write token for the repo) and is never printed. --dry-run shows
what would go where and sends nothing. Without a token, send both files by any file transfer.
A pack of a synthetic root (pool-synth, pool-demo: it carries SYNTHETIC.json) is refused, --dry-run
too: made-up results never reach the dataset. --synthetic-ok sends one to another --repo, to try the
upload itself.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub.errors import HfHubHTTPError

from ..cli import Parser, fail, reports_errors
from ..hub.fetch import ITEMS_REPO
from ..hub.pack import SYNTHETIC, is_synthetic
from ..hub.upload import plan_upload, upload
from ..settings import load_settings


@reports_errors
def main(argv: list[str] | None = None) -> None:
    p = Parser(prog="pool-upload", description=__doc__)
    p.add_argument("tarball", type=Path, help="pool_returns_<host>_<date>.tar.gz (its .sha256 beside it)")
    p.add_argument("--repo", default=ITEMS_REPO, help="dataset repo (default %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="print what would be uploaded where")
    p.add_argument(
        "--synthetic-ok", action="store_true", help=f"send a synthetic pack (it holds {SYNTHETIC}) to another --repo"
    )
    args = p.parse_args(argv)
    tar_path: Path = args.tarball
    sha_path = tar_path.with_name(tar_path.name.removesuffix(".tar.gz") + ".sha256")
    for f in (tar_path, sha_path):
        if not f.is_file():
            fail(f"{f} not found (pool-pack writes both)")
    try:
        transfers = plan_upload(tar_path, sha_path)
        synthetic = is_synthetic(tar_path)
    except ValueError as e:
        fail(str(e))
    if synthetic and not args.synthetic_ok:
        fail(f"{tar_path.name} holds {SYNTHETIC}: its results come from a synthetic pool (pool-synth, pool-demo) "
             f"and never go to the dataset; to try an upload, pass --synthetic-ok --repo <your test repo>")  # fmt: skip
    if args.synthetic_ok and args.repo == ITEMS_REPO:
        fail(f"--synthetic-ok needs --repo naming a test repo: {ITEMS_REPO} is the real dataset")
    token = None if args.dry_run else load_settings().hf_token
    if token is None and not args.dry_run:
        fail("HF_TOKEN is not set: a write token for the repo is needed (or send the files by any transfer)")
    for t in transfers:
        print(
            f"{'would upload' if args.dry_run else 'upload'} {t.local} ({t.local.stat().st_size:,} B) -> "
            f"dataset {args.repo}: {t.remote}"
        )
    if token is None:
        return
    try:
        urls = upload(transfers, token.get_secret_value(), args.repo)
    except HfHubHTTPError as e:
        fail(f"the hub refused the upload: {e}")
    for u in urls:
        print(f"uploaded: {u}")


if __name__ == "__main__":
    main()
