"""The item table: load `items/*.parquet|*.csv|*.jsonl` with pyarrow and validate per protocol v1.

Validation runs as column operations over the whole table; only rejected rows are visited one by
one to name their reasons. Every rejected item lands in the report: nothing is dropped silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from .protocol import LETTERS, MAX_OPTIONS

REQUIRED = ("item_id", "benchmark", "video_id", "question", "options")
GOLD_COLUMNS = ("answer", "gold", "answer_index", "answer_idx", "label")
SUFFIXES = (".parquet", ".csv", ".jsonl")

ITEM_SCHEMA = pa.schema(
    [
        ("item_id", pa.string()),
        ("benchmark", pa.string()),
        ("video_id", pa.string()),
        ("question", pa.string()),
        ("options", pa.list_(pa.string())),
        ("gold", pa.int16()),
        ("n_options", pa.int16()),
    ]
)
REPORT_SCHEMA = pa.schema(
    [("item_id", pa.string()), ("source", pa.string()), ("row", pa.int64()), ("reason", pa.string())]
)


class ItemsError(ValueError):
    """A whole input file is unusable (missing columns, unreadable): nothing in it can be judged."""


@dataclass(frozen=True)
class ItemSet:
    items: pa.Table  # ITEM_SCHEMA, valid items only
    rejected: pa.Table  # REPORT_SCHEMA, one row per rejected item
    n_read: int

    @cached_property
    def by_id(self) -> dict[str, int]:
        return {k: i for i, k in enumerate(self.items.column("item_id").to_pylist())}


def item_files(items_dir: Path) -> list[Path]:
    if not items_dir.is_dir():
        raise ItemsError(f"items folder {items_dir} does not exist")
    files = sorted(p for p in items_dir.iterdir() if p.suffix in SUFFIXES and p.is_file())
    if not files:
        raise ItemsError(f"no item tables (*.parquet, *.csv, *.jsonl) in {items_dir}")
    return files


def _read(path: Path) -> pa.Table:
    try:
        if path.suffix == ".parquet":
            return pq.read_table(path)
        if path.suffix == ".csv":
            opts = pacsv.ConvertOptions(
                column_types={c: pa.string() for c in (*REQUIRED, "answer", "gold")}, strings_can_be_null=False
            )
            return pacsv.read_csv(path, convert_options=opts)
        return pajson.read_json(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise ItemsError(f"{path}: cannot read item table: {e}") from e


def _options_column(col: pa.ChunkedArray) -> tuple[pa.Array, pa.Array]:
    """Options as list<string>, plus a mask of rows whose options are not a list of strings."""
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        arr = col.combine_chunks().cast(pa.list_(pa.string()))
        return arr, pc.is_null(arr)
    parsed: list[list[str] | None] = []
    for s in col.to_pylist():  # JSON-encoded strings: the one per-row parse the format forces
        try:
            v = json.loads(s) if s is not None else None
        except (TypeError, ValueError):
            v = None
        parsed.append(v if isinstance(v, list) and all(isinstance(x, str) for x in v) else None)
    arr = pa.array(parsed, type=pa.list_(pa.string()))
    return arr, pc.is_null(arr)


def _gold_column(table: pa.Table, n_opts: pa.Array) -> tuple[pa.Array, pa.Array, str]:
    """Gold as a 0-based index and a mask of rows whose gold is missing or out of range."""
    name = next((c for c in GOLD_COLUMNS if c in table.column_names), None)
    if name is None:
        raise ItemsError(f"no gold answer column (one of {', '.join(GOLD_COLUMNS)})")
    col = table.column(name).combine_chunks()
    if pa.types.is_integer(col.type):
        idx = col.cast(pa.int64())
    else:
        s = pc.utf8_trim_whitespace(col.cast(pa.string()))
        letter_idx = pc.index_in(s, value_set=pa.array(list(LETTERS)))
        is_digits = pc.match_substring_regex(s, r"^[0-9]{1,3}$")
        digit_idx = pc.cast(pc.if_else(is_digits, s, None), pa.int64())
        idx = pc.coalesce(letter_idx.cast(pa.int64()), digit_idx)
    bad = pc.or_kleene(pc.is_null(idx), pc.or_kleene(pc.less(idx, 0), pc.greater_equal(idx, n_opts)))
    return idx, pc.fill_null(bad, True), name


def _unsafe_video_id(vid: pa.Array) -> pa.Array:
    """Anything that is not a plain relative name could leave the frame cache."""
    s = pc.fill_null(vid, "")
    bad = pc.or_(pc.equal(s, ""), pc.match_substring_regex(s, r"[/\\\x00]|^\.\.?$|\.\."))
    return pc.or_(bad, pc.match_substring_regex(s, r"^\s|\s$"))


def validate(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Split a raw table (REQUIRED columns + "answer") into valid items and rejections (source left empty)."""
    n = table.num_rows
    item_id = table.column("item_id").combine_chunks().cast(pa.string())
    strings = {c: pc.utf8_trim_whitespace(table.column(c).combine_chunks().cast(pa.string())) for c in REQUIRED[:4]}
    options, opt_bad = _options_column(table.column("options"))
    n_opts = pc.fill_null(pc.list_value_length(options), 0).cast(pa.int64())
    gold, gold_bad, gold_name = _gold_column(table, n_opts)

    flat = pc.list_flatten(options)
    empty_flat = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(pc.fill_null(flat, ""))), 0)
    parents = pc.list_parent_indices(options)
    empty_rows = pc.unique(pc.filter(parents, empty_flat)) if len(flat) else pa.array([], pa.int64())
    has_empty_opt = pc.is_in(pa.array(range(n), pa.int64()), value_set=empty_rows.cast(pa.int64()))

    checks: list[tuple[pa.Array, str]] = [
        (pc.equal(pc.fill_null(pc.utf8_length(strings["item_id"]), 0), 0), "empty item_id"),
        (pc.equal(pc.fill_null(pc.utf8_length(strings["benchmark"]), 0), 0), "empty benchmark"),
        (pc.equal(pc.fill_null(pc.utf8_length(strings["question"]), 0), 0), "empty question"),
        (_unsafe_video_id(table.column("video_id").combine_chunks().cast(pa.string())), "unsafe or empty video_id"),
        (opt_bad, "options is not a list of strings"),
        (
            pc.and_(pc.invert(opt_bad), pc.or_(pc.less(n_opts, 2), pc.greater(n_opts, MAX_OPTIONS))),
            f"needs 2..{MAX_OPTIONS} options",
        ),
        (has_empty_opt, "empty option text"),
        (pc.and_(pc.invert(opt_bad), gold_bad), f"{gold_name} missing or out of range"),
    ]
    counts = pa.table({"item_id": item_id}).group_by("item_id").aggregate([("item_id", "count")])
    dup_ids = pc.filter(counts.column("item_id"), pc.greater(counts.column("item_id_count"), 1))
    checks.append((pc.fill_null(pc.is_in(item_id, value_set=dup_ids), False), "duplicate item_id"))

    any_bad = checks[0][0]
    for mask, _ in checks[1:]:
        any_bad = pc.or_(any_bad, mask)
    any_bad = pc.fill_null(any_bad, True)

    bad_rows = pc.indices_nonzero(any_bad).to_pylist()
    masks = [(m.to_numpy(zero_copy_only=False), why) for m, why in checks]
    ids = item_id.to_pylist()
    report = pa.table(
        {
            "item_id": [ids[r] for r in bad_rows],
            "source": [""] * len(bad_rows),
            "row": bad_rows,
            "reason": ["; ".join(why for m, why in masks if m[r]) for r in bad_rows],
        },
        schema=REPORT_SCHEMA,
    )
    keep = pc.invert(any_bad)
    items = pa.table(
        {
            "item_id": strings["item_id"],
            "benchmark": strings["benchmark"],
            "video_id": strings["video_id"],
            "question": strings["question"],
            "options": options,
            "gold": gold.cast(pa.int16(), safe=False),
            "n_options": n_opts.cast(pa.int16()),
        },
        schema=ITEM_SCHEMA,
    ).filter(keep)
    return items, report


def load_items(items_dir: Path) -> ItemSet:
    """All item tables of a folder, validated together (an id duplicated across files is rejected)."""
    raw: list[pa.Table] = []
    for path in item_files(items_dir):
        t = _read(path)
        missing = [c for c in REQUIRED if c not in t.column_names]
        if missing:
            raise ItemsError(f"{path}: missing column(s) {', '.join(missing)}")
        gold_name = next((c for c in GOLD_COLUMNS if c in t.column_names), None)
        if gold_name is None:
            raise ItemsError(f"{path}: no gold answer column (one of {', '.join(GOLD_COLUMNS)})")
        t = t.select([*REQUIRED, gold_name]).rename_columns([*REQUIRED, "answer"])
        options, _ = _options_column(t.column("options"))
        t = t.set_column(4, "options", options).set_column(5, "answer", t.column("answer").cast(pa.string()))
        raw.append(t.append_column("_source", pa.array([path.name] * t.num_rows, pa.string())))
    table = pa.concat_tables(raw)
    items, report = validate(table.drop_columns(["_source"]))
    if report.num_rows:
        # name the file each rejected row came from, and its row within that file
        offsets = [0]
        for t in raw:
            offsets.append(offsets[-1] + t.num_rows)
        rows = report.column("row").to_pylist()
        src, local = [], []
        for r in rows:
            f = next(i for i in range(len(raw)) if offsets[i] <= r < offsets[i + 1])
            src.append(raw[f].column("_source")[0].as_py())
            local.append(r - offsets[f])
        report = report.set_column(1, "source", pa.array(src, pa.string())).set_column(
            2, "row", pa.array(local, pa.int64())
        )
    return ItemSet(items=items, rejected=report, n_read=table.num_rows)
