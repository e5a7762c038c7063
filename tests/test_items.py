import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pool_queue.items import ItemsError, load_items


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


OK = {"benchmark": "B", "video_id": "v1", "question": "Q?", "options": ["a", "b", "c"], "answer": "B"}


def test_synthetic_pool_loads_all_three_formats(small_root):
    s = load_items(small_root / "items")
    assert s.n_read == 240 and s.items.num_rows == 240 and s.rejected.num_rows == 0
    golds = s.items.column("gold").to_pylist()
    assert all(0 <= g < n for g, n in zip(golds, s.items.column("n_options").to_pylist(), strict=True))


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
    s = load_items(tmp_path / "items")
    assert sorted(s.items.column("item_id").to_pylist()) == ["good", "idx-ok", "kvid"]
    reasons = {(r["item_id"], r["source"], r["row"]): r["reason"] for r in s.rejected.to_pylist()}
    assert reasons[("dup", "t.jsonl", 1)] == "duplicate item_id" and ("dup", "t.jsonl", 2) in reasons
    assert "2..26 options" in reasons[("one", "t.jsonl", 3)] and "2..26" in reasons[("many", "t.jsonl", 4)]
    assert reasons[("noq", "t.jsonl", 5)] == "empty question"
    assert reasons[("emptyopt", "t.jsonl", 6)] == "empty option text"
    assert "out of range" in reasons[("goldletter", "t.jsonl", 7)]
    assert "out of range" in reasons[("goldidx", "t.jsonl", 8)]
    assert "out of range" in reasons[("goldneg", "u.parquet", 0)]
    for i, name in enumerate(["dotdot", "escape", "abs", "back", "nul"], start=1):
        assert reasons[(name, "u.parquet", i)] == "unsafe or empty video_id"
    assert s.rejected.num_rows == 14 and s.n_read == 17


def test_duplicate_across_files_and_json_string_options(tmp_path):
    (tmp_path / "items").mkdir()
    write_jsonl(tmp_path / "items" / "a.jsonl", [{**OK, "item_id": "x"}])
    (tmp_path / "items" / "b.csv").write_text(
        'item_id,benchmark,video_id,question,options,answer\nx,B,v,Q,"[""p"", ""q""]",A\ny,B,v,Q,"[""p"", ""q""]",1\n'
        "z,B,v,Q,not json,A\n"
    )
    s = load_items(tmp_path / "items")
    assert s.items.column("item_id").to_pylist() == ["y"]
    assert s.items.column("options").to_pylist() == [["p", "q"]] and s.items.column("gold").to_pylist() == [1]
    got = {r["item_id"]: r["reason"] for r in s.rejected.to_pylist()}
    assert got["x"] == "duplicate item_id" and got["z"] == "options is not a list of strings"


def test_unusable_file_is_a_clear_error(tmp_path):
    (tmp_path / "items").mkdir()
    write_jsonl(tmp_path / "items" / "a.jsonl", [{"item_id": "x", "question": "q"}])
    with pytest.raises(ItemsError, match="missing column"):
        load_items(tmp_path / "items")
    with pytest.raises(ItemsError, match="does not exist"):
        load_items(tmp_path / "nope")


def test_mixed_types_in_one_jsonl_column_is_a_file_error(tmp_path):
    (tmp_path / "items").mkdir()
    write_jsonl(tmp_path / "items" / "a.jsonl", [{**OK, "item_id": "x"}, {**OK, "item_id": "y", "answer": 1}])
    with pytest.raises(ItemsError, match=r"a\.jsonl: cannot read item table"):
        load_items(tmp_path / "items")
