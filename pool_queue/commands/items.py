"""pool-items: load and validate the item table; print rejected items (file, the 1-based line an editor
shows, reason) and warnings about confusing options, look-alike ids and frame folders whose name differs
from a video_id only by Unicode form; optionally write the rejections to a file."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pyarrow.csv as pacsv
from rich.console import Console
from rich.table import Table

from ..cli import number, parser, reports_errors
from ..cli import settings as cli_settings
from ..inputs.frames import unicode_form_twins
from ..inputs.items import item_warnings, load_items


@reports_errors
def main(argv: list[str] | None = None) -> None:
    p = parser("pool-items", __doc__ or "")
    p.add_argument("--report", type=Path, help="write the rejected items (item_id, source, line, reason) as CSV here")
    p.add_argument("--show", type=number(int, 0), default=50, help="rejected rows to print (default 50)")
    args = p.parse_args(argv)
    settings = cli_settings(args)
    items = load_items(settings.items_dir, settings.root_named())
    con = Console()
    per_bench = items.items.group_by("benchmark").aggregate([("item_id", "count")]).sort_by("benchmark")
    t = Table(
        "benchmark", "items", title=f"{items.items.num_rows} valid of {items.n_read} read from {settings.items_dir}"
    )
    for b, n in zip(
        per_bench.column("benchmark").to_pylist(), per_bench.column("item_id_count").to_pylist(), strict=True
    ):
        t.add_row(b, str(n))
    con.print(t)
    rej = items.rejected
    if rej.num_rows:
        r = Table("item_id", "source", "line", "reason", title=f"{rej.num_rows} rejected items")
        for row in rej.slice(0, args.show).to_pylist():
            place = f"row {row['line']}" if row["source"].lower().endswith(".parquet") else str(row["line"])
            r.add_row(repr(row["item_id"]), row["source"], place, row["reason"])
        con.print(r)
        reasons = pc.value_counts(rej.column("reason")).to_pylist()
        con.print("by reason: " + ", ".join(f"{d['values']}: {d['counts']}" for d in reasons))
    warn = item_warnings(items.items)
    if warn.num_rows:
        w = Table("item_id", "warning", title=f"{warn.num_rows} warnings (screened anyway; check the prompt)")
        for row in warn.slice(0, args.show).to_pylist():
            w.add_row(repr(row["item_id"]), row["warning"])
        con.print(w)
    twins = unicode_form_twins(items.items.column("video_id"), settings.frames_dir)
    for vid, folder in zip(twins.column("video_id").to_pylist(), twins.column("folder").to_pylist(), strict=True):
        con.print(f"warning: video_id {vid!a} has no frame folder, but folder {folder!a} differs from it "
                  "only by Unicode form (NFC/NFD); its items get no frame step until the folder is renamed to the id",
                  soft_wrap=True, markup=False, highlight=False)  # fmt: skip
    if args.report is not None:
        pacsv.write_csv(rej, args.report)
        con.print(f"rejected items written to {args.report}")
