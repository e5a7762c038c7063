"""pool-report: write the screen's report (Markdown + PNG plots) into a report folder.

The run package's return report (per step: items done, removed, error rows with examples, wall
time (busy time: `report.busy_s`) and items/s per GPU), removal per benchmark x step with the
option-count mix, sanity flags, and the trust section (chance floor, 4/4 vs 3/4, borderline items,
picked letters, margins).
"""

from __future__ import annotations

from pathlib import Path

from ..cli import load_protocol, parser, reports_errors
from ..cli import settings as cli_settings
from ..inputs.items import load_items
from ..observe.markdown import PLOTS, write_report
from ..store.store import Store


@reports_errors
def main(argv: list[str] | None = None) -> None:
    p = parser("pool-report", __doc__ or "")
    p.add_argument("--out", type=Path, help="report folder (default: <results root>/../report)")
    args = p.parse_args(argv)
    settings = cli_settings(args)
    protocol = load_protocol(settings)
    store = Store(settings.results_dir, protocol.fingerprint, named=settings.results_named())
    out = args.out or settings.results_dir.parent / "report"
    store.require_screen("report")
    items = load_items(settings.items_dir, settings.root_named())
    path = write_report(store, items, protocol, out, settings.frames_dir)
    print(f"report: {path} (+ {', '.join(PLOTS)})")
