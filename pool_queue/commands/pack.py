"""pool-pack: audit the results root, then write pool_returns_<host>_<date>.tar.gz and its .sha256.

The tarball holds results/pool/step1..3 and logs/ (the run package's section 8), including the
audit's findings as logs/pool_audit.txt. A results root with audit problems is not packed unless
--force (then the problems travel in that file). Default destination: the folder that holds
results/ (the package root).
"""

from __future__ import annotations

from pathlib import Path

from ..cli import fail, load_protocol, output_dir, parser, reports_errors
from ..cli import settings as cli_settings
from ..hub.pack import pack, pack_name, upload_hint
from ..observe.audit import audit_results, summary


@reports_errors
def main(argv: list[str] | None = None) -> None:
    p = parser("pool-pack", __doc__ or "")
    p.add_argument("--out", type=Path, help="where the tarball goes (default: the folder holding results/)")
    p.add_argument("--name", help="file name stem (default pool_returns_<host>_<YYYYMMDD>)")
    p.add_argument("--force", action="store_true", help="pack even if the audit finds problems")
    args = p.parse_args(argv)
    settings = cli_settings(args)
    # a bad --out before the audit
    out = output_dir(args.out) if args.out else settings.results_dir.resolve().parent.parent
    found = audit_results(settings)
    text = summary(found)
    print(text)
    if found.problems and not args.force:
        fail("the audit found problems (above): fix them, or pack anyway with --force", code=1)
    settings.logs_dir.mkdir(parents=True, exist_ok=True)
    (settings.logs_dir / "pool_audit.txt").write_text(text + "\n")
    try:
        steps = sorted(load_protocol(settings).steps)
        tar_path, sha_path = pack(
            settings.results_dir, settings.logs_dir, steps, out, args.name or pack_name(), root=settings.root
        )
    except (FileNotFoundError, PermissionError) as e:
        fail(str(e))
    print(f"packed {tar_path} ({tar_path.stat().st_size / 1e6:,.1f} MB)\nchecksum {sha_path}")
    print(upload_hint(tar_path))


if __name__ == "__main__":
    main()
