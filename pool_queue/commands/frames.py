"""pool-frames: verify frames_manifest.json (sha256 per shard) and extract the tar shards into the cache."""

from __future__ import annotations

from pathlib import Path

from ..cli import parser, reports_errors
from ..cli import settings as cli_settings
from ..inputs.shards import extract, verify


@reports_errors
def main(argv: list[str] | None = None) -> None:
    p = parser("pool-frames", __doc__ or "")
    p.add_argument(
        "--tars", type=Path, help="folder with the shards and frames_manifest.json (default <root>/frames_tar)"
    )
    p.add_argument("--verify-only", action="store_true", help="check checksums, extract nothing")
    args = p.parse_args(argv)
    settings = cli_settings(args)
    tars = args.tars or settings.frames_tar_dir
    if args.verify_only:
        m = verify(tars)
        print(f"{len(m.shards)} shards OK ({m.n_videos} videos)")
    else:
        n = extract(tars, settings.frames_dir)
        print(f"extracted {n} video folders into {settings.frames_dir}")
