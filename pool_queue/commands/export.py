"""pool-export: write one row per item and step (the winners) as Parquet and merged JSONL.

Output: <out>/results/pool/step{N}/step{N}.jsonl (the run package's layout, so a packed return reads
as one row per item) and <out>/parquet/step{N}.parquet, every step with the same schema
(rows.ROW_SCHEMA; docs/operations.md, "Exported data"), in a folder of their own so that `<out>/parquet` reads as
one dataset (duckdb, pyarrow.dataset, pandas).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow.parquet as pq

from ..cli import exe, fail, load_protocol, output_dir, parser, reports_errors, settings
from ..errors import SetupError
from ..rows import ROW_SCHEMA, to_arrow
from ..store.store import STAMP, Store

PARQUET = "parquet"  # <out>/parquet/step{N}.parquet: the Parquet files alone, one dataset
BATCH = 5000  # rows in memory at once


def export(store: Store, steps: list[int], out: Path) -> dict[int, int]:
    """Streamed `BATCH` winners at a time, so memory stays flat whatever the pool's size (each row holds
    every forward's top-20: a step's rows at once took 1.5 GB at 30,000 items)."""
    counts = {}
    (out / PARQUET).mkdir(parents=True, exist_ok=True)
    for step in steps:
        winners = store.winners(step)
        d = out / "results" / "pool" / f"step{step}"
        d.mkdir(parents=True, exist_ok=True)
        jsonl, parquet = d / f"step{step}.jsonl", out / PARQUET / f"step{step}.parquet"
        try:
            with jsonl.open("wb") as f, pq.ParquetWriter(parquet, ROW_SCHEMA) as pw:  # an empty step: its schema
                for start in range(0, winners.num_rows, BATCH):
                    rows = store.read_rows(step, winners.slice(start, BATCH))
                    f.write(b"".join(orjson.dumps(r) + b"\n" for r in rows))
                    pw.write_table(to_arrow(rows))
        except OSError as e:  # a full disk: pyarrow's errors name no file
            raise SetupError(f"cannot write the export under {out}: {e.strerror or e}") from None
        counts[step] = winners.num_rows
    return counts


@reports_errors
def main(argv: list[str] | None = None) -> None:
    p = parser("pool-export", __doc__ or "")
    p.add_argument("--out", type=Path, required=True, help="export folder (must not be the results root)")
    a = p.parse_args(argv)
    s = settings(a)
    protocol = load_protocol(s)
    if a.out.resolve() == s.results_dir.resolve():
        fail("--out must differ from the results root")
    if not (s.results_dir / STAMP).is_file():
        fail(f"no results to export: {s.results_dir} ({s.results_named()}) holds no screen (check --root / --results)")
    counts = export(
        Store(s.results_dir, protocol.fingerprint, named=s.results_named()), sorted(protocol.steps), output_dir(a.out)
    )
    for step, n in counts.items():
        print(f"step {step}: {n} rows -> {a.out}/{PARQUET}/step{step}.parquet, "
              f"{a.out}/results/pool/step{step}/step{step}.jsonl")  # fmt: skip
    print(f"all steps as one table: {exe('duckdb')} -c \"select * from '{a.out}/{PARQUET}/*.parquet'\"")
