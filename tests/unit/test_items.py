import codecs
import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pool_queue.commands.items import main
from pool_queue.inputs.frames import find_frames, frame_videos, unicode_form_twins, video_folder
from pool_queue.inputs.items import (
    ItemsError,
    _options_column,
    id_lookalikes,
    item_warnings,
    load_items,
    option_warnings,
)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


OK = {"benchmark": "B", "video_id": "v1", "question": "Q?", "options": ["a", "b", "c"], "answer": "B"}


def test_synthetic_pool_loads_all_three_formats(small_root):
    item_set = load_items(small_root / "items")
    assert item_set.n_read == 240 and item_set.items.num_rows == 240 and item_set.rejected.num_rows == 0
    golds = item_set.items.column("gold").to_pylist()
    assert all(0 <= g < n for g, n in zip(golds, item_set.items.column("n_options").to_pylist(), strict=True))


def test_every_rule_rejects_and_names_the_item(tmp_path):
    rows = [
        {**OK, "item_id": "good"},
        {**OK, "item_id": "dup"},
        {**OK, "item_id": "dup"},
        {**OK, "item_id": "one", "options": ["a"]},
        {**OK, "item_id": "many", "options": [f"o{i}" for i in range(27)]},
        {**OK, "item_id": "noq", "question": " "},
        {**OK, "item_id": "emptyopt", "options": ["a", " "]},
        {**OK, "item_id": "goldletter", "answer": "D"},
        {**OK, "item_id": "goldidx", "answer": "3"},
        {**OK, "item_id": "goldneg", "answer": -1},
        {**OK, "item_id": "dotdot", "video_id": ".."},
        {**OK, "item_id": "escape", "video_id": "../x"},
        {**OK, "item_id": "abs", "video_id": "/etc"},
        {**OK, "item_id": "back", "video_id": "a\\b"},
        {**OK, "item_id": "nul", "video_id": "a\x00b"},
        {**OK, "item_id": "kvid", "video_id": "k:yt123"},
        {**OK, "item_id": "idx-ok", "answer": 2},
    ]
    (tmp_path / "items").mkdir()
    write_jsonl(tmp_path / "items" / "t.jsonl", [{**r, "answer": r["answer"]} for r in rows[:9]])
    t = pa.Table.from_pylist([{**r, "answer": str(r["answer"])} for r in rows[9:]])
    pq.write_table(t, tmp_path / "items" / "u.parquet")
    item_set = load_items(tmp_path / "items")
    assert sorted(item_set.items.column("item_id").to_pylist()) == ["good", "idx-ok", "kvid"]
    reasons = {(r["item_id"], r["source"], r["line"]): r["reason"] for r in item_set.rejected.to_pylist()}
    assert reasons[("dup", "t.jsonl", 2)] == "duplicate item_id" and ("dup", "t.jsonl", 3) in reasons
    assert "2..26 options" in reasons[("one", "t.jsonl", 4)] and "2..26" in reasons[("many", "t.jsonl", 5)]
    assert reasons[("noq", "t.jsonl", 6)] == "empty question"
    assert reasons[("emptyopt", "t.jsonl", 7)] == "empty option text"
    assert "out of range" in reasons[("goldletter", "t.jsonl", 8)]
    assert "out of range" in reasons[("goldidx", "t.jsonl", 9)]
    assert "out of range" in reasons[("goldneg", "u.parquet", 1)]  # a Parquet file's rows count from 1 too
    for i, name in enumerate(["dotdot", "escape", "abs", "back", "nul"], start=2):
        assert reasons[(name, "u.parquet", i)] == "unsafe or empty video_id"
    assert item_set.rejected.num_rows == 14 and item_set.n_read == 17


def test_duplicate_across_files_and_json_string_options(tmp_path):
    (tmp_path / "items").mkdir()
    write_jsonl(tmp_path / "items" / "a.jsonl", [{**OK, "item_id": "x"}])
    (tmp_path / "items" / "b.csv").write_text(
        'item_id,benchmark,video_id,question,options,answer\nx,B,v,Q,"[""p"", ""q""]",A\ny,B,v,Q,"[""p"", ""q""]",1\n'
        "z,B,v,Q,not json,A\n"
    )
    item_set = load_items(tmp_path / "items")
    assert item_set.items.column("item_id").to_pylist() == ["y"]
    assert item_set.items.column("options").to_pylist() == [["p", "q"]] and item_set.items.column(
        "gold"
    ).to_pylist() == [1]
    got = {r["item_id"]: r["reason"] for r in item_set.rejected.to_pylist()}
    assert got["x"] == "duplicate item_id" and got["z"] == "options is not a list of strings"


def test_unusable_file_is_a_clear_error(tmp_path):
    (tmp_path / "items").mkdir()
    write_jsonl(tmp_path / "items" / "a.jsonl", [{"item_id": "x", "question": "q"}])
    with pytest.raises(ItemsError, match="missing column"):
        load_items(tmp_path / "items")
    with pytest.raises(ItemsError, match="does not exist"):
        load_items(tmp_path / "nope")


def test_a_bad_line_or_mixed_row_is_one_rejected_item_and_the_rest_load(tmp_path):
    (tmp_path / "items").mkdir()
    lines = [
        json.dumps({**OK, "item_id": "x"}),
        json.dumps({**OK, "item_id": "y", "answer": 1}),  # answer types differ between lines
        '{"item_id": "broken", "benchmark": ',  # cut off
        json.dumps({**OK, "item_id": "z", "options": json.dumps(["p", "q"])}),  # the other options form
        "[1, 2]",
        "",
        json.dumps({**OK, "item_id": 17}),  # a numeric id
    ]
    (tmp_path / "items" / "a.jsonl").write_text("\n".join(lines) + "\n")
    item_set = load_items(tmp_path / "items")
    assert sorted(item_set.items.column("item_id").to_pylist()) == ["17", "x", "y", "z"]
    got = {(r["item_id"], r["line"]): r["reason"] for r in item_set.rejected.to_pylist()}
    assert got[("broken", 3)].startswith("line cut in the middle") and got[("", 5)] == "not a JSON object"
    assert item_set.n_read == 6


def test_types_are_unified_across_files_and_writers(tmp_path):
    d = tmp_path / "items"
    d.mkdir()
    pq.write_table(pa.table({"item_id": pa.array([1, 2], pa.int64()), "benchmark": ["B", "B"], "video_id": ["v", "v"],
                             "question": ["Q", "Q"], "options": [["a", "b"], ["a", "b"]], "answer": [0, 1]}),
                   d / "ints.parquet")  # fmt: skip
    big = pa.table({"item_id": pa.array(["L1"], pa.large_string()), "benchmark": pa.array(["B"], pa.large_string()),
                    "video_id": pa.array(["v"], pa.large_string()), "question": pa.array(["Q"], pa.large_string()),
                    "options": pa.array([["a", "b"]], pa.large_list(pa.large_string())), "answer": [1.0]})  # fmt: skip
    pq.write_table(big, d / "polars.parquet")
    (d / "c.csv").write_text('item_id,benchmark,video_id,question,options,answer\n3,B,v,Q,"[""a"", ""b""]",1.0\n')
    numbers = pa.array([[1, 2]], pa.list_(pa.int64()))
    pq.write_table(pa.table({"item_id": ["n"], "benchmark": ["B"], "video_id": ["v"], "question": ["Q"],
                             "options": numbers, "answer": [0]}), d / "num.parquet")  # fmt: skip
    item_set = load_items(d)
    assert sorted(item_set.items.column("item_id").to_pylist()) == ["1", "2", "3", "L1"]
    ids, gold = item_set.items.column("item_id").to_pylist(), item_set.items.column("gold").to_pylist()
    assert dict(zip(ids, gold, strict=True)) == {
        "1": 0, "2": 1, "3": 1, "L1": 1}  # fmt: skip
    assert {r["item_id"]: r["reason"] for r in item_set.rejected.to_pylist()} == {
        "n": "options is not a list of strings"
    }
    pq.write_table(pa.table({"item_id": ["s"], "benchmark": ["B"], "video_id": ["v"], "question": [{"a": 1}],
                             "options": [["a", "b"]], "answer": [0]}), d / "struct.parquet")  # fmt: skip
    with pytest.raises(ItemsError, match=r"struct.parquet: column 'question' is struct"):
        load_items(d)


def test_trimmed_duplicates_conflicting_gold_and_one_gold_rule(tmp_path):
    (tmp_path / "items").mkdir()
    rows = [
        {**OK, "item_id": "ws-dup"},
        {**OK, "item_id": " ws-dup "},
        {**OK, "item_id": "both-agree", "gold": 1},
        {**OK, "item_id": "both-differ", "gold": 2},
        {**OK, "item_id": "float-str", "answer": "1.0"},
        {**OK, "item_id": "float", "answer": 2.0},
        {**OK, "item_id": "half", "answer": 1.5},
    ]
    write_jsonl(tmp_path / "items" / "a.jsonl", rows)
    item_set = load_items(tmp_path / "items")
    ids, gold = item_set.items.column("item_id").to_pylist(), item_set.items.column("gold").to_pylist()
    assert dict(zip(ids, gold, strict=True)) == {
        "both-agree": 1, "float-str": 1, "float": 2}  # fmt: skip
    got = {(r["item_id"], r["line"]): r["reason"] for r in item_set.rejected.to_pylist()}
    assert got[("ws-dup", 1)] == got[("ws-dup", 2)] == "duplicate item_id"
    assert got[("both-differ", 4)] == "gold columns answer and gold disagree"
    assert "out of range" in got[("half", 7)]


def test_option_warnings_name_confusing_items(tmp_path):
    (tmp_path / "items").mkdir()
    rows = [{**OK, "item_id": "same", "options": ["cat", "dog", "cat "]},
            {**OK, "item_id": "lettered", "options": ["red\nB. blue", "green"]}, {**OK, "item_id": "fine"}]  # fmt: skip
    write_jsonl(tmp_path / "items" / "a.jsonl", rows)
    w = option_warnings(load_items(tmp_path / "items").items)
    assert {r["item_id"]: r["warning"] for r in w.to_pylist()} == {
        "same": "two options with the same text",
        "lettered": "an option text holds a letter line (like 'B. ...')",
    }


# ---- what real table exports write: each loads, or is refused naming the file and the reason


def _table(n: int, **cols: object) -> pa.Table:
    base = {"item_id": [f"i{k}" for k in range(n)], "benchmark": ["B"] * n, "video_id": ["v"] * n,
            "question": ["Q?"] * n, "answer": ["A"] * n}  # fmt: skip
    return pa.table({**base, **cols})


def test_a_csv_of_any_size_with_quoted_newlines_loads(tmp_path):
    items = tmp_path / "items"
    items.mkdir()
    lines = ["item_id,benchmark,video_id,question,options,answer"]
    lines += [f'c{k},B,v,"line one\nline two, {"x" * 200}",' + '"[""a"", ""b""]",A' for k in range(8000)]
    (items / "big.csv").write_text("\n".join(lines) + "\n")
    assert (items / "big.csv").stat().st_size > 1_500_000  # past pyarrow's block size
    item_set = load_items(items)
    assert item_set.items.num_rows == 8000 and item_set.rejected.num_rows == 0
    assert item_set.items.column("question")[7999].as_py().startswith("line one\nline two")


@pytest.mark.parametrize(
    "options",
    [
        pa.array([["a", "b"], ["c", "d"]], pa.list_(pa.string(), 2)),  # fixed_size_list
        pa.array([["a", "b"], ["c", "d"]], pa.large_list(pa.large_string())),
        pa.array([["a", "b"], ["c", "d"]], pa.list_view(pa.string())),
        pa.array([["a", "b"], ["c", "d"]], pa.large_list_view(pa.string())),
        pa.array([["a", "b"], ["c", "d"]], pa.list_(pa.string_view())),
    ],
    ids=lambda a: str(a.type),
)
def test_every_arrow_list_type_of_options_loads(tmp_path, options):
    got, bad = _options_column(options)  # list views cannot be stored in Parquet: the column rule itself
    assert got.to_pylist() == [["a", "b"], ["c", "d"]] and not pc.any(bad).as_py()
    if pa.types.is_list_view(options.type) or pa.types.is_large_list_view(options.type):
        return
    items = tmp_path / "items"
    items.mkdir()
    pq.write_table(_table(2, options=options), items / "x.parquet")
    item_set = load_items(items)
    assert item_set.items.column("options").to_pylist() == [["a", "b"], ["c", "d"]] and item_set.rejected.num_rows == 0


def test_ids_are_kept_exactly_or_refused_never_rounded(tmp_path):
    items = tmp_path / "items"
    items.mkdir()
    big = 2**64 + 1  # past int64: pyarrow's JSON reader would make it 1.8446744073709552e+19
    (items / "a.jsonl").write_text(
        "\n".join(json.dumps({**OK, "item_id": i}) for i in (big, 9223372036854775808, 12)) + "\n"
        + json.dumps({**OK, "item_id": 1.5e300}).replace("1.5e+300", "1.50e300") + "\n"
    )  # fmt: skip
    pq.write_table(_table(3, item_id=pa.array([9007199254740993.0, 77.0, 3.5]),
                          options=pa.array([["a", "b"]] * 3)), items / "b.parquet")  # fmt: skip
    item_set = load_items(items)
    ids = set(item_set.items.column("item_id").to_pylist())
    assert {str(big), "9223372036854775808", "12", "1.50E+300"} <= ids, ids
    assert {"3.5", "77"} <= ids and not any("e+15" in i for i in ids)
    (why,) = item_set.rejected.column("reason").to_pylist()
    assert "item_id is a float beyond 2^53" in why
    assert item_set.rejected.column("source").to_pylist() == ["b.parquet"]


def test_float_ids_as_pandas_writes_integers_beside_a_nan_are_the_integers_or_named(tmp_path):
    """A float64 id column: whole numbers are the integers in every format (Parquet and JSONL alike), a NaN
    is no id: named at its row, never loaded as the id "nan"."""
    items = tmp_path / "items"
    items.mkdir()
    pq.write_table(_table(2, item_id=pa.array([101.0, float("nan")]), options=pa.array([["a", "b"]] * 2)),
                   items / "a.parquet")  # fmt: skip
    (items / "b.jsonl").write_text(json.dumps({"item_id": 202.0, **OK}) + "\n")  # as pandas' to_json writes it
    item_set = load_items(items)
    assert sorted(item_set.items.column("item_id").to_pylist()) == ["101", "202"]
    assert item_set.rejected.select(["item_id", "line"]).to_pylist() == [{"item_id": "nan", "line": 2}]
    assert "NaN" in item_set.rejected.column("reason")[0].as_py()


def test_a_partitioned_parquet_folder_and_upper_case_suffixes_are_read(tmp_path):
    items = tmp_path / "items"
    items.mkdir()
    (items / "parts.parquet").mkdir()
    pq.write_table(_table(2, options=pa.array([["a", "b"]] * 2)), items / "parts.parquet" / "part-0.parquet")
    pq.write_table(
        _table(1, item_id=["p2"], options=pa.array([["a", "b"]])), items / "parts.parquet" / "part-1.parquet"
    )
    write_jsonl(items / "UPPER.JSONL", [{**OK, "item_id": "u1"}])
    (items / "Other.CSV").write_text(
        'item_id,benchmark,video_id,question,options,answer\nc1,B,v,Q?,"[""a"", ""b""]",A\n'
    )
    item_set = load_items(items)
    assert sorted(item_set.items.column("item_id").to_pylist()) == ["c1", "i0", "i1", "p2", "u1"]


def test_a_repeated_column_name_is_refused_by_name(tmp_path):
    items = tmp_path / "items"
    items.mkdir()
    (items / "x.csv").write_text('item_id,benchmark,video_id,question,options,answer,question\nc1,B,v,Q,"[]",A,Q2\n')
    with pytest.raises(ItemsError, match=r"x\.csv: column name\(s\) 'question' appear more than once"):
        load_items(items)


def test_a_jsonl_file_whose_every_line_is_bad_reports_the_lines(tmp_path):
    items = tmp_path / "items"
    items.mkdir()
    (items / "bad.jsonl").write_text('{"item_id": "cut", "benchmark": \n')
    write_jsonl(items / "good.jsonl", [{**OK, "item_id": "g"}])
    item_set = load_items(items)
    assert item_set.items.column("item_id").to_pylist() == ["g"]
    assert item_set.rejected.column("reason").to_pylist() == [item_set.rejected.column("reason")[0].as_py()]
    assert "line cut in the middle" in item_set.rejected.column("reason")[0].as_py()
    assert item_set.rejected.column("line").to_pylist() == [1]


def test_a_jsonl_line_holding_several_items_names_each_of_them(tmp_path):
    """Two objects on one line (a writer that lost a newline): both items are named, each with the
    reason, whatever their ids are (text or numbers); the line's neighbours load."""
    items = tmp_path / "items"
    items.mkdir()
    pair = json.dumps({**OK, "item_id": "a"}) + " " + json.dumps({**OK, "item_id": 42})
    (items / "a.jsonl").write_text(json.dumps({**OK, "item_id": "before"}) + "\n" + pair + "\n")
    item_set = load_items(items)
    assert item_set.items.column("item_id").to_pylist() == ["before"]
    assert item_set.rejected.select(["item_id", "line", "reason"]).to_pylist() == [
        {"item_id": i, "line": 2, "reason": "2 JSON values on one line (JSONL holds one item per line)"}
        for i in ("a", "42")
    ]


def test_ids_that_differ_only_by_unicode_form_or_invisible_characters_are_named_together(tmp_path):
    items = tmp_path / "items"
    items.mkdir()
    write_jsonl(
        items / "a.jsonl", [{**OK, "item_id": i} for i in ("caf\u00e9-1", "cafe\u0301-1", "q\u200b7", "q7", "z")]
    )
    item_set = load_items(items)
    assert item_set.items.num_rows == 5  # two items each: ids are matched exactly
    got = {(r["item_id"], r["warning"]) for r in id_lookalikes(item_set.items).to_pylist()}
    assert {i for i, _ in got} == {"caf\u00e9-1", "cafe\u0301-1", "q\u200b7", "q7"}
    assert ("q7", "its id looks like 'q\\u200b7' (differs only by Unicode form or invisible characters)") in got
    assert len(item_warnings(item_set.items)) == 4


# ---- places and text as a user sees them


def test_a_rejection_names_the_file_line_an_editor_shows(tmp_path):
    items = tmp_path / "items"
    items.mkdir()
    head = "item_id,benchmark,video_id,question,options,answer\n"
    opts = '"[""a"", ""b""]"'
    (items / "a.csv").write_text(head + f'c1,B,v,"two\nlines",{opts},A\nc2,B,v,Q,{opts},Z\nc3,B,v,Q,{opts},A\n')
    (items / "b.csv").write_text(head + f"d1,B,v,Q,{opts},A\n\nd2,B,v,Q,{opts},Z\n")  # a blank line between
    (items / "c.jsonl").write_text(json.dumps({**OK, "item_id": "j1"}) + "\n\n" + json.dumps({**OK, "item_id": "j2",
                                   "answer": "Z"}) + "\n")  # fmt: skip
    item_set = load_items(items)
    assert {(r["source"], r["line"]) for r in item_set.rejected.to_pylist()} == {
        ("a.csv", 4),
        ("b.csv", 4),
        ("c.jsonl", 3),
    }
    report = tmp_path / "report.csv"
    main(["--root", str(tmp_path), "--report", str(report)])
    assert report.read_text().splitlines()[0] == '"item_id","source","line","reason"'
    assert '"c2","a.csv",4,' in report.read_text()


def test_a_lone_surrogate_or_an_invisible_question_is_a_rejected_item(tmp_path):
    items = tmp_path / "items"
    items.mkdir()
    lines = [json.dumps({**OK, "item_id": "ok"}), json.dumps({**OK, "item_id": "sur", "question": "a\ud800b"})]
    lines += [json.dumps({**OK, "item_id": f"zw{k}", "question": q})
              for k, q in enumerate(["\u200b", "\u200c\u200d", " \u2060\t\ufeff ", "\u00ad\u3164"])]  # fmt: skip
    lines.append(json.dumps({**OK, "item_id": "zw-option", "options": ["a", "\u200b"]}))
    (items / "a.jsonl").write_text("\n".join(lines) + "\n")
    item_set = load_items(items)
    assert item_set.items.column("item_id").to_pylist() == ["ok"]
    got = {r["item_id"]: (r["line"], r["reason"]) for r in item_set.rejected.to_pylist()}
    assert got["sur"] == (2, "question holds a lone surrogate escape (half of a UTF-16 pair, not a character)")
    assert all(got[f"zw{k}"] == (3 + k, "empty question") for k in range(4))
    assert got["zw-option"] == (7, "empty option text")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-8-sig"])
def test_a_utf16_or_utf32_file_is_read_as_what_it_is(tmp_path, encoding):
    items = tmp_path / "items"
    items.mkdir()
    rows = [{**OK, "item_id": "caf\u00e9"}, {**OK, "item_id": "bad", "answer": "Z"}]
    (items / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding=encoding)
    csv_text = 'item_id,benchmark,video_id,question,options,answer\nc\u00e9,B,v,Q,"[""a"", ""b""]",A\n'
    (items / "b.csv").write_text(csv_text, encoding=encoding)
    item_set = load_items(items)
    assert sorted(item_set.items.column("item_id").to_pylist()) == ["caf\u00e9", "c\u00e9"]
    assert item_set.rejected.select(["item_id", "line"]).to_pylist() == [{"item_id": "bad", "line": 2}]
    (items / "a.jsonl").write_bytes(codecs.BOM_UTF16_LE + "{".encode("utf-16-le") + b"\x00\xd8")
    with pytest.raises(ItemsError, match=r"a\.jsonl: UTF-16 text that does not decode"):
        load_items(items)


def test_a_frame_folder_in_another_unicode_form_is_its_video_and_a_mixed_one_is_named(tmp_path, capsys):
    """An NFC video_id and its folder in NFD (a tar made on macOS) are one video for the planner and the
    worker alike; a folder mixing both forms is no spelling of the id, and pool-items names the pair."""
    items, frames = tmp_path / "items", tmp_path / "frames" / "pool_frames"
    items.mkdir()
    for folder in ("cafe\u0301", "plain", "cafe\u0301-\u00e9"):  # NFD; ASCII; NFD and NFC mixed
        (frames / folder).mkdir(parents=True)
        (frames / folder / "frame_0.jpg").write_bytes(b"x")
    vids = ["caf\u00e9", "caf\u00e9", "plain", "gone", "caf\u00e9-\u00e9"]
    write_jsonl(items / "a.jsonl", [{**OK, "item_id": f"i{k}", "video_id": v} for k, v in enumerate(vids)])
    assert video_folder(frames, "caf\u00e9") == (frames / "cafe\u0301", "")
    assert [p.name for p in find_frames(frames, "caf\u00e9")] == ["frame_0.jpg"]
    assert video_folder(frames, "caf\u00e9-\u00e9")[0] is None
    assert sorted(frame_videos(frames).to_pylist()) == sorted(["cafe\u0301", "plain", "cafe\u0301-\u00e9", "caf\u00e9"])
    twins = unicode_form_twins(load_items(items).items.column("video_id"), frames)
    assert twins.to_pylist() == [{"video_id": "caf\u00e9-\u00e9", "folder": "cafe\u0301-\u00e9"}]
    main(["--root", str(tmp_path)])
    said = capsys.readouterr().out
    assert "video_id 'caf\\xe9-\\xe9' has no frame folder, but folder 'cafe\\u0301-\\xe9' differs" in said
    assert "video_id 'caf\\xe9' has" not in said
