"""The item table: load `items/*.parquet|*.csv|*.jsonl` with pyarrow and validate per protocol v1.

Validation runs as column operations over the whole table; only rejected rows are visited one by
one to name their reasons. Every rejected item lands in the report: nothing is dropped silently.

A rejection names its place as a user finds it in an editor: `line` is the 1-based line of the file
where the item starts (a CSV's header is line 1, so its first item is line 2; a quoted value that
holds newlines moves the next items down); for Parquet, which has no lines, it is the 1-based row.

Text files are read as UTF-8 (a UTF-8 BOM is skipped); a UTF-16 or UTF-32 file, as spreadsheet tools
export, is recognized by its BOM or, without one, by the NUL bytes of its first ASCII character (as
JSON's own rule, RFC 4627) and read as what it is. Such a file that does not decode is refused by name.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import re
from dataclasses import dataclass
from decimal import Decimal
from functools import cached_property
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from ..errors import ItemsError
from ..protocol import LETTERS, MAX_OPTIONS
from ..text import printable

REQUIRED = ("item_id", "benchmark", "video_id", "question", "options")
GOLD_COLUMNS = ("answer", "gold", "answer_index", "answer_idx", "label")
USED = (*REQUIRED, *GOLD_COLUMNS)  # the fields an item is made of
SUFFIXES = (".parquet", ".csv", ".jsonl")
ID_COLUMNS = ("item_id", "video_id", "benchmark")  # text that must keep its exact spelling
LIST_TYPES = (pa.ListType, pa.LargeListType, pa.FixedSizeListType, pa.ListViewType, pa.LargeListViewType)
EXACT_FLOAT = 2.0**53  # a float id at or beyond this may already be rounded: refused, never guessed

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
RAW_SCHEMA = pa.schema(
    [
        *((c, pa.string()) for c in ("item_id", "benchmark", "video_id", "question")),
        *((c, pa.string()) for c in ("answer", "gold", "answer_index", "answer_idx", "label")),
        ("options", pa.list_(pa.string())),
        ("_source", pa.string()),
        ("_row", pa.int64()),
        ("_inexact", pa.string()),  # an id column whose value is a float too large to be exact, or NaN
    ]
)
_ID_IN_LINE = re.compile(r'"item_id"\s*:\s*(?:"([^"]{1,200})"|(-?[0-9][0-9.eE+-]{0,60}))')  # text, or a number
REPORT_SCHEMA = pa.schema(
    [("item_id", pa.string()), ("source", pa.string()), ("line", pa.int64()), ("reason", pa.string())]
)
# Text with nothing a reader can see: whitespace, controls, format characters (U+200B..U+200D, U+2060,
# U+FEFF, soft hyphen), variation selectors, the combining grapheme joiner and the Hangul/Braille fillers.
INVISIBLE_ONLY = (
    r"^[\s\p{Z}\p{Cc}\p{Cf}\x{034F}\x{115F}\x{1160}\x{2800}\x{3164}\x{FFA0}\x{FE00}-\x{FE0F}\x{E0100}-\x{E01EF}]*$"
)
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")  # the escape of a surrogate, lone or half of a pair
BOMS = (  # UTF-32 before UTF-16: FF FE 00 00 begins with FF FE
    (codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"),
)  # fmt: skip


@dataclass(frozen=True)
class ItemSet:
    items: pa.Table  # ITEM_SCHEMA, valid items only
    rejected: pa.Table  # REPORT_SCHEMA, one row per rejected item
    n_read: int

    @cached_property
    def by_id(self) -> dict[str, int]:
        return {k: i for i, k in enumerate(self.items.column("item_id").to_pylist())}


def item_files(items_dir: Path, root_named: str = "") -> list[Path]:
    """The item tables of a folder: suffixes matched without case (`X.JSONL`), and a `*.parquet` folder
    (a partitioned dataset) as one table. Anything else with one of these suffixes is refused by name.
    `root_named`: how the package root was chosen (Settings.root_named), said when the folder is missing."""
    if not items_dir.is_dir():
        raise ItemsError(f"items folder {items_dir} does not exist" + (f" (root: {root_named})" if root_named else ""))
    files = []
    for p in sorted(items_dir.iterdir()):
        kind = _kind(p)
        if kind is None or p.name.startswith("."):
            continue
        if not (p.is_file() or (kind == ".parquet" and p.is_dir())):
            raise ItemsError(f"{printable(str(p))}: not a readable {kind} file (a folder, a broken link?)")
        files.append(p)
    if not files:
        raise ItemsError(f"no item tables (*.parquet, *.csv, *.jsonl) in {items_dir}")
    return files


def _kind(path: Path) -> str | None:
    suffix = path.suffix.lower()
    return suffix if suffix in SUFFIXES else None


def _read(path: Path) -> tuple[pa.Table, pa.Table]:
    """A file's table (with `_row`: the 1-based line where each item starts, or the row of a Parquet
    file) and the lines rejected while reading."""
    kind = _kind(path)
    try:
        if kind == ".parquet":
            t = pq.read_table(path)  # a partitioned folder too
            rows = pa.array(range(1, t.num_rows + 1), pa.int64())
        else:
            data = _utf8(path)
            if kind == ".csv":
                t = _read_csv(data)
                rows = _csv_lines(data, t)
            else:
                try:
                    t = pajson.read_json(pa.BufferReader(data))
                except pa.ArrowInvalid:  # a bad line, a lone surrogate, a column whose type changes between lines
                    return _read_jsonl_lines(path, data)
                floats = any(pa.types.is_floating(t.schema.field(c).type) for c in ID_COLUMNS if c in t.column_names)
                if floats or t.num_rows != _count_lines(data):  # floats: pyarrow rounds ids, the lines keep them
                    return _read_jsonl_lines(path, data)  # blank or doubled lines: only the lines know the numbers
                rows = pa.array(range(1, t.num_rows + 1), pa.int64())
    except (pa.ArrowInvalid, OSError) as e:
        raise ItemsError(f"{path}: cannot read item table: {e}") from e
    dup = sorted({c for c in t.column_names if t.column_names.count(c) > 1})
    if dup:
        raise ItemsError(f"{path}: column name(s) {', '.join(map(repr, dup))} appear more than once; keep one of each")
    return t.append_column("_row", rows), REPORT_SCHEMA.empty_table()


def _utf8(path: Path) -> bytes:
    """A text file's bytes as UTF-8: a UTF-8 BOM dropped, UTF-16 and UTF-32 (by BOM, or by the NULs of a
    first ASCII character) decoded; one that does not decode is refused naming its encoding."""
    data = path.read_bytes()
    if data.startswith(codecs.BOM_UTF8):
        return data[len(codecs.BOM_UTF8) :]
    enc = next((e for bom, e in BOMS if data.startswith(bom)), None)
    if enc is None and b"\x00" in data[:4]:
        head = bytes(b != 0 for b in data[:4].ljust(4, b"\x00"))
        enc = {b"\0\0\0\1": "utf-32-be", b"\1\0\0\0": "utf-32-le"}.get(head) or (
            "utf-16-be" if head[:2] == b"\0\1" else "utf-16-le" if head[:2] == b"\1\0" else None
        )
    if enc is None:
        return data
    try:
        return data.decode(enc).encode("utf-8")
    except UnicodeError as e:  # a cut or damaged file, or a lone surrogate in UTF-16/32
        raise ItemsError(f"{path}: {enc.upper()} text that does not decode ({e}); save it again as UTF-8") from e


def _read_csv(data: bytes) -> pa.Table:
    text = {c: pa.string() for c in (*REQUIRED, *GOLD_COLUMNS)}
    return pacsv.read_csv(
        pa.BufferReader(data),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),  # quoted newlines, at any file size
        convert_options=pacsv.ConvertOptions(column_types=text, strings_can_be_null=False),
    )


def _breaks(text: pa.Array) -> pa.Array:
    """Line breaks per value (\\n, \\r\\n or a lone \\r, as the CSV reader splits lines)."""
    return pc.subtract(
        pc.add(pc.count_substring(text, "\n"), pc.count_substring(text, "\r")), pc.count_substring(text, "\r\n")
    )


def _count_lines(data: bytes) -> int:
    """Lines of a file as an editor numbers them, trailing line breaks aside."""
    body = data.rstrip(b"\r\n")
    return (body.count(b"\n") + body.count(b"\r") - body.count(b"\r\n") + 1) if body else 0


def _csv_lines(data: bytes, t: pa.Table) -> pa.Array:
    """The 1-based file line where each CSV record starts: the header's lines, then one line per record
    plus the line breaks inside its quoted values, as column sums. Blank lines between records (the
    reader skips them) are the one thing the values cannot tell: then the lines are counted by Python's
    csv reader, which keeps its line number."""
    n = t.num_rows
    header = 1 + sum(c.count("\n") + c.count("\r") - c.count("\r\n") for c in t.column_names)
    inside = pa.array([0] * n, pa.int64())
    for field, col in zip(t.schema, t.columns, strict=True):  # by position: a repeated name is refused later
        if pa.types.is_string(field.type):
            inside = pc.add(inside, _breaks(col.combine_chunks()).cast(pa.int64()))
    if not n:
        return inside
    starts = pc.subtract(pc.add(pc.cumulative_sum(inside), pa.array(range(header + 1, header + n + 1))), inside)
    if header + n + (pc.sum(inside).as_py() or 0) == _count_lines(data):
        return starts
    reader = csv.reader(io.StringIO(data.decode("utf-8", "replace"), newline=""))
    found, before = [], 0
    for record in reader:
        if record:
            found.append(before + 1)
        before = reader.line_num
    return pa.array(found[1:], pa.int64()) if len(found) == n + 1 else starts  # [0]: the header


def _surrogate_field(obj: dict[str, object]) -> str | None:
    """The first field of an item whose text holds a lone surrogate escape (as "\\ud800")."""
    for k in USED:
        try:
            json.dumps(obj.get(k), ensure_ascii=False, default=str).encode("utf-8")
        except UnicodeEncodeError:
            return k
    return None


def _read_jsonl_lines(path: Path, data: bytes) -> tuple[pa.Table, pa.Table]:
    """JSONL line by line: a line that is not a JSON object is one rejected item; the rest load.

    A lone surrogate escape ("\\ud800", half of a UTF-16 pair) decodes to no character: the item is
    rejected naming the field, not screened with a text changed from what the file says."""
    rows: list[dict[str, object]] = []
    bad: list[dict[str, object]] = []
    for i, line in enumerate(io.BytesIO(data), start=1):
        if not line.strip():
            continue
        text = line.decode("utf-8", "replace")
        body = line.rstrip(b"\r\n")
        try:  # numbers as their own digits: an id is never rounded, however large
            obj = json.loads(body, parse_float=Decimal, parse_int=_exact_int)
        except json.JSONDecodeError as e:
            obj, why = None, f"not valid JSON ({e.msg}, at column {e.colno})"
            if e.pos >= len(e.doc) or e.msg.startswith("Unterminated string"):  # the text ends inside the item
                why = (
                    "line cut in the middle: it ends inside its item (a file cut short, or a raw line break in a value)"
                )
            elif e.msg == "Extra data" and len(values := _values_in(text)) > 1:
                why = f"{len(values)} JSON values on one line (JSONL holds one item per line)"
        except ValueError as e:  # bytes that are not UTF-8
            obj, why = None, f"not valid JSON ({e})"
        else:
            why = "not a JSON object"
        if isinstance(obj, dict) and _SURROGATE.search(line) and (field := _surrogate_field(obj)) is not None:
            obj, why = None, f"{field} holds a lone surrogate escape (half of a UTF-16 pair, not a character)"
        if not isinstance(obj, dict):  # every item the line names is named in the report, not only its first
            ids = list(dict.fromkeys(t or n for t, n in _ID_IN_LINE.findall(text))) or [""]
            bad += [{"item_id": found, "source": path.name, "line": i, "reason": why} for found in ids]
            continue
        rows.append({**obj, "_row": i})
    names = {k for r in rows for k in r if k in USED}  # other fields are never read, whatever they hold
    cols: dict[str, list[object]] = {c: [r.get(c) for r in rows] for c in (*names, "_row")}
    table = {c: pa.array([_scalar_text(_whole(v) if c in ID_COLUMNS else v) for v in vals], pa.string())
             for c, vals in cols.items() if c != "_row"}  # fmt: skip
    if "options" in cols:
        table["options"] = pa.array([_options_value(v) for v in cols["options"]], pa.list_(pa.string()))
    table["_row"] = pa.array(cols.get("_row", []), pa.int64())
    return pa.table(table), pa.Table.from_pylist(bad, schema=REPORT_SCHEMA)


def _values_in(text: str) -> list[object]:
    """The JSON values written one after another on a line (`{...} {...}`), as far as they decode."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while (at := len(text) - len(text[at:].lstrip())) < len(text):
        try:
            value, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            break
        values.append(value)
    return values


def _whole(v: object) -> object:
    """An id written as a whole float (`101.0`, as pandas writes integers beside a NaN) as its integer,
    the id a Parquet file of the same column gives; other values as they are."""
    if isinstance(v, Decimal) and v.is_finite() and v == v.to_integral_value() and abs(v) < EXACT_FLOAT:
        return int(v)
    return v


def _scalar_text(v: object) -> str | None:
    """A JSON scalar as text (a number keeps its JSON spelling); lists, objects and booleans are not text."""
    if isinstance(v, bool) or v is None or isinstance(v, list | dict):
        return None
    return str(v)


def _exact_int(digits: str) -> int | Decimal:
    """Integers as Python ints (exact at any size); past 4300 digits, Python refuses int(): kept as text."""
    return int(digits) if len(digits) < 4000 else Decimal(digits)


def _options_value(v: object) -> list[str] | None:
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return None
    return v if isinstance(v, list) and all(isinstance(x, str) for x in v) else None


def _options_column(col: pa.ChunkedArray | pa.Array) -> tuple[pa.Array, pa.Array]:
    """Options as list<string>, plus a mask of rows whose options are not a list of strings. One rule for
    every format: a list of strings, natively or JSON-encoded in a text column; numbers are not options."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if isinstance(arr.type, LIST_TYPES):  # list, large_list, fixed_size_list, list_view, large_list_view
        vt = arr.type.value_type
        if (
            pa.types.is_string(vt)
            or pa.types.is_large_string(vt)
            or pa.types.is_string_view(vt)
            or pa.types.is_null(vt)
        ):
            if isinstance(arr.type, pa.ListViewType | pa.LargeListViewType):  # pyarrow 26 casts views wrongly
                out = pa.array(arr.to_pylist(), pa.list_(pa.string()))
            else:
                out = arr.cast(pa.list_(pa.string()))
            return out, pc.is_null(out)
        return pa.nulls(len(arr), pa.list_(pa.string())), pa.array([True] * len(arr), pa.bool_())
    out = pa.array([_options_value(v) for v in arr.cast(pa.string()).to_pylist()], pa.list_(pa.string()))
    return out, pc.is_null(out)


def _gold_index(col: pa.Array) -> pa.Array:
    """One rule for every format: a 0-based index (2, 2.0, "2", "2.0") or a capital letter ("C")."""
    text = pc.utf8_trim_whitespace(col.cast(pa.string()))
    letter = pc.index_in(text, value_set=pa.array(list(LETTERS))).cast(pa.int64())
    is_num = pc.fill_null(pc.match_substring_regex(text, r"^-?[0-9]{1,3}(\.0*)?$"), False)
    digits = pc.replace_substring_regex(pc.if_else(is_num, text, pa.scalar(None, pa.string())), r"\.0*$", "")
    return pc.coalesce(letter, pc.cast(digits, pa.int64()))


def _gold(table: pa.Table, n_opts: pa.Array) -> tuple[pa.Array, list[tuple[pa.Array, str]]]:
    """Gold from the first gold column that has a value; checks: out of range, and columns that disagree."""
    present = [c for c in GOLD_COLUMNS if c in table.column_names and table.column(c).null_count < table.num_rows]
    idx = [(c, _gold_index(table.column(c).combine_chunks())) for c in present]
    gold = pc.coalesce(*(i for _, i in idx)) if idx else pa.nulls(table.num_rows, pa.int64())
    bad = pc.or_kleene(pc.is_null(gold), pc.or_kleene(pc.less(gold, 0), pc.greater_equal(gold, n_opts)))
    name = "/".join(present) or "answer"
    checks = [(pc.fill_null(bad, True), f"{name} missing or out of range")]
    for k, (col, ia) in enumerate(idx):
        for other, ib in idx[k + 1 :]:
            checks.append((pc.fill_null(pc.not_equal(ia, ib), False), f"gold columns {col} and {other} disagree"))
    return gold, checks


def _unsafe_video_id(vid: pa.Array) -> pa.Array:
    """Anything that is not a plain relative name could leave the frame cache."""
    ids = pc.fill_null(vid, "")
    bad = pc.or_(pc.equal(ids, ""), pc.match_substring_regex(ids, r"[/\\\x00]|^\.\.?$|\.\."))
    return pc.or_(bad, pc.match_substring_regex(ids, r"^\s|\s$"))


def _blank(text: pa.Array) -> pa.Array:
    """Text with nothing visible (missing, empty, or only `INVISIBLE_ONLY` characters) counts as empty."""
    return pc.fill_null(pc.match_substring_regex(text, INVISIBLE_ONLY), True)


def validate(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Split a canonical table (`_canonical`) into valid items and rejections (with `_source` and `_row`)."""
    n = table.num_rows
    strings = {c: pc.utf8_trim_whitespace(table.column(c).combine_chunks()) for c in REQUIRED[:4]}
    item_id = strings["item_id"]  # duplicates are found on the id as it will be used: trimmed
    options = table.column("options").combine_chunks()
    opt_bad = pc.is_null(options)
    n_opts = pc.fill_null(pc.list_value_length(options), 0).cast(pa.int64())
    gold, gold_checks = _gold(table, n_opts)

    flat = pc.list_flatten(options)
    empty_flat = _blank(flat)
    parents = pc.list_parent_indices(options)
    empty_rows = pc.unique(pc.filter(parents, empty_flat)) if len(flat) else pa.array([], pa.int64())
    has_empty_opt = pc.is_in(pa.array(range(n), pa.int64()), value_set=empty_rows.cast(pa.int64()))

    checks: list[tuple[pa.Array, str]] = [
        (_blank(strings["item_id"]), "empty item_id"),
        (_blank(strings["benchmark"]), "empty benchmark"),
        (_blank(strings["question"]), "empty question"),
        (_unsafe_video_id(table.column("video_id").combine_chunks()), "unsafe or empty video_id"),
        (opt_bad, "options is not a list of strings"),
        (
            pc.and_(pc.invert(opt_bad), pc.or_(pc.less(n_opts, 2), pc.greater(n_opts, MAX_OPTIONS))),
            f"needs 2..{MAX_OPTIONS} options",
        ),
        (has_empty_opt, "empty option text"),
        *((pc.and_(pc.invert(opt_bad), m), why) for m, why in gold_checks),
        *(
            (
                pc.fill_null(pc.equal(table.column("_inexact"), c), False),
                f"{c} is a float beyond 2^53 or NaN, not an exact id",
            )
            for c in ID_COLUMNS
        ),
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
    take = pa.array(bad_rows, pa.int64())
    report = pa.table(
        {
            "item_id": item_id.take(take),
            "source": table.column("_source").take(take),
            "line": table.column("_row").take(take),
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


def _canonical(path: Path, t: pa.Table) -> pa.Table:
    """One file's columns as the canonical raw schema, so that files of any writer concatenate; a column
    that cannot be read as its type refuses the file, naming it and the column."""
    missing = [c for c in REQUIRED if c not in t.column_names]
    if missing:
        raise ItemsError(f"{path}: missing column(s) {', '.join(missing)}")
    if not any(c in t.column_names for c in GOLD_COLUMNS):
        raise ItemsError(f"{path}: no gold answer column (one of {', '.join(GOLD_COLUMNS)})")
    cols: dict[str, pa.Array] = {}
    inexact = pa.nulls(t.num_rows, pa.string())
    for c in ID_COLUMNS:  # a float id at or past 2^53 may already be another number, a NaN is none: refused
        if pa.types.is_floating(t.schema.field(c).type):
            v = t.column(c).combine_chunks().cast(pa.float64())
            bad = pc.fill_null(pc.or_(pc.greater_equal(pc.abs(v), EXACT_FLOAT), pc.is_nan(v)), False)
            inexact = pc.if_else(pc.and_(bad, pc.is_null(inexact)), pa.scalar(c), inexact)
    for c in (*REQUIRED[:4], *GOLD_COLUMNS):
        if c not in t.column_names:
            cols[c] = pa.nulls(t.num_rows, pa.string())
            continue
        try:
            cols[c] = t.column(c).combine_chunks().cast(pa.string())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise ItemsError(f"{path}: column {c!r} is {t.column(c).type}, which cannot be read as text") from e
    cols["options"] = _options_column(t.column("options"))[0]
    cols["_source"] = pa.array([path.name] * t.num_rows, pa.string())
    cols["_row"] = t.column("_row").combine_chunks()
    cols["_inexact"] = inexact
    return pa.table(cols, schema=RAW_SCHEMA)


def load_items(items_dir: Path, root_named: str = "") -> ItemSet:
    """All item tables of a folder, validated together (an id duplicated across files is rejected)."""
    tables, read_errors = [], []
    for path in item_files(items_dir, root_named):
        t, bad = _read(path)
        if t.num_rows or not bad.num_rows:  # a file whose every line is bad is reported by its lines' reasons
            tables.append(_canonical(path, t))
        read_errors.append(bad)
    table = pa.concat_tables(tables) if tables else RAW_SCHEMA.empty_table()
    items, report = validate(table)
    report = pa.concat_tables([*read_errors, report])
    return ItemSet(items=items, rejected=report, n_read=table.num_rows + sum(b.num_rows for b in read_errors))


def option_warnings(items: pa.Table) -> pa.Table:
    """Valid items whose options may confuse the prompt: two equal option texts, or an option text holding
    a line that looks like another option ("B. ...")."""
    opts = items.column("options").combine_chunks()
    flat = pc.utf8_trim_whitespace(pc.list_flatten(opts))
    parent = pc.list_parent_indices(opts)
    pairs = pa.table({"p": parent, "t": flat}).group_by(["p", "t"]).aggregate([("t", "count")])
    dup = pc.unique(pc.filter(pairs.column("p"), pc.greater(pairs.column("t_count"), 1)))
    lettered = pc.unique(pc.filter(parent, pc.match_substring_regex(flat, r"(^|\n)\s*[A-Z][.)]\s")))
    ids = items.column("item_id")
    return pa.concat_tables(
        [
            pa.table({"item_id": ids.take(dup), "warning": pa.array(["two options with the same text"] * len(dup))}),
            pa.table(
                {
                    "item_id": ids.take(lettered),
                    "warning": pa.array(["an option text holds a letter line (like 'B. ...')"] * len(lettered)),
                }
            ),
        ]
    )


def id_lookalikes(items: pa.Table) -> pa.Table:
    """Valid items whose id differs from another's only by Unicode normalization (NFKC) or invisible
    characters (format characters such as U+200B). They stay two items: an id is matched exactly, as
    the store and every export match it; the warning names both, since such pairs are usually one
    question exported twice."""
    ids = items.column("item_id").combine_chunks()
    key = pc.replace_substring_regex(pc.utf8_normalize(ids, form="NFKC"), r"\p{Cf}", "")
    groups = pa.table({"key": key, "id": ids}).group_by("key").aggregate([("id", "list")])
    twins = groups.filter(pc.greater(pc.list_value_length(groups.column("id_list")), 1)).column("id_list").to_pylist()
    rows = [(a, f"its id looks like {b!r} (differs only by Unicode form or invisible characters)")
            for ids_ in twins for a in ids_ for b in ids_ if a != b]  # fmt: skip
    return pa.table({"item_id": pa.array([r[0] for r in rows], pa.string()),
                     "warning": pa.array([r[1] for r in rows], pa.string())})  # fmt: skip


def item_warnings(items: pa.Table) -> pa.Table:
    """Everything `pool-items` warns about: confusing options and look-alike ids."""
    schema = pa.schema([("item_id", pa.string()), ("warning", pa.string())])
    return pa.concat_tables([option_warnings(items).cast(schema), id_lookalikes(items).cast(schema)])
