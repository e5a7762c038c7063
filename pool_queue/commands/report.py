"""pool-report: write the screen's report (Markdown + PNG plots) into a report folder.

The run package's return report (per step: items done, removed, error rows with examples, wall
time (busy time: `report.busy_s`) and items/s per GPU), removal per benchmark x step with the
option-count mix, sanity flags, and the trust section (chance floor, 4/4 vs 3/4, borderline items,
picked letters, margins).
"""

from __future__ import annotations

from pathlib import Path

from ..cli import load_protocol, parser, reports_errors, settings
from ..inputs.items import load_items
from ..observe.markdown import PLOTS, write_report
from ..store.store import Store


@reports_errors
def main(argv: list[str] | None = None) -> None:
    p = parser("pool-report", __doc__ or "")
    p.add_argument("--out", type=Path, help="report folder (default: <results root>/../report)")
    a = p.parse_args(argv)
    s = settings(a)
    protocol = load_protocol(s)
    store = Store(s.results_dir, protocol.fingerprint, named=s.results_named())
    out = a.out or s.results_dir.parent / "report"
    store.check_stamp()
    path = write_report(store, load_items(s.items_dir), protocol, out, s.frames_dir)
    print(f"report: {path} (+ {', '.join(PLOTS)})")
