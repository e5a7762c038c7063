"""pool-export: write one row per item and step (the winners) as Parquet and merged JSONL.

Output: <out>/results/pool/step{N}/step{N}.jsonl (the run package's layout, so a packed return reads
as one row per item) and <out>/parquet/step{N}.parquet, every step with the same schema
(rows.ROW_SCHEMA; docs/operations.md, "Exported data"), in a folder of their own so that `<out>/parquet` reads as
one dataset (duckdb, pyarrow.dataset, pandas).
"""

from __future__ import annotations

from pathlib import Path

from ..cli import exe, fail, load_protocol, output_dir, parser, reports_errors
from ..cli import settings as cli_settings
from ..store.export import PARQUET, export
from ..store.store import Store


@reports_errors
def main(argv: list[str] | None = None) -> None:
    p = parser("pool-export", __doc__ or "")
    p.add_argument("--out", type=Path, required=True, help="export folder (must not be the results root)")
    args = p.parse_args(argv)
    settings = cli_settings(args)
    protocol = load_protocol(settings)
    results, out = settings.results_dir.resolve(), args.out.resolve()
    written = [out / "results" / "pool", out / PARQUET]  # the folders it fills
    if any(w.is_relative_to(results) or results.is_relative_to(w) for w in written):
        fail(f"--out {args.out} would write the export among the rows of the results root {settings.results_dir} "
             "(the store would read them as its own): choose a folder outside it")  # fmt: skip
    store = Store(settings.results_dir, protocol.fingerprint, named=settings.results_named())
    store.require_screen("export")
    counts = export(store, sorted(protocol.steps), output_dir(args.out))
    for step, (n, before) in counts.items():
        was = "" if before is None else f" (replacing an earlier export's {before:,})"
        print(f"step {step}: {n:,} rows{was} -> {args.out}/{PARQUET}/step{step}.parquet, "
              f"{args.out}/results/pool/step{step}/step{step}.jsonl")  # fmt: skip
    print(f"all steps as one table: {exe('duckdb')} -c \"select * from '{args.out}/{PARQUET}/*.parquet'\"")
