"""pool-export: write one row per item and step (the winners) as Parquet and merged JSONL.

Output: <out>/results/pool/step{N}/step{N}.jsonl (the run package's layout, so a packed return reads
as one row per item) and <out>/step{N}.parquet, every step with the same schema (rows.ROW_SCHEMA;
README, "Exported data"), so `select * from '<out>/*.parquet'` reads all steps at once.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow.parquet as pq

from ..cli import fail, load_protocol, parser, reports_errors, settings
from ..rows import to_arrow
from ..store import STAMP, Store


def export(store: Store, steps: list[int], out: Path) -> dict[int, int]:
    counts = {}
    for step in steps:
        rows = store.read_rows(step, store.winners(step))
        d = out / "results" / "pool" / f"step{step}"
        d.mkdir(parents=True, exist_ok=True)
        with (d / f"step{step}.jsonl").open("wb") as f:
            f.write(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        pq.write_table(to_arrow(rows), out / f"step{step}.parquet")  # an empty step too: the schema is known
        counts[step] = len(rows)
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
        fail(f"no results to export: {s.results_dir} holds no screen (check --root / --results)")
    counts = export(Store(s.results_dir, protocol.fingerprint), sorted(protocol.steps), a.out)
    for step, n in counts.items():
        print(f"step {step}: {n} rows -> {a.out}/step{step}.parquet, {a.out}/results/pool/step{step}/step{step}.jsonl")
