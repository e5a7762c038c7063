import logging
import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from pool_queue.errors import StoreError
from pool_queue.rows import ROW_SCHEMA, ForwardRecord, Row
from pool_queue.store.store import STAMP, Store


def row(item_id, status="ok", t=1.0, fp="fp1", removed=False, kind=None, **kw):
    return {
        "item_id": item_id,
        "step": 1,
        "status": status,
        "benchmark": "B",
        "error_kind": kind,
        "removed": removed if status == "ok" else None,
        "finished_at": t,
        "fingerprint": fp,
        **kw,
    }


def test_write_read_and_winner_rules(tmp_path):
    st = Store(tmp_path, "fp1")
    a, b = st.writer(1, "a"), st.writer(1, "b")
    a.write([row("x", "error", t=1.0, kind="transient"), row("y", t=5.0, tag="late")])
    b.write([row("x", t=9.0), row("y", t=2.0, tag="early"), row("z", "error", t=3.0, kind="permanent")])
    w = {r["item_id"]: r for r in st.read_rows(1, st.winners(1))}
    assert w["x"]["status"] == "ok"  # ok beats an earlier error
    assert w["y"]["tag"] == "early"  # among equals, the earliest
    assert w["z"]["status"] == "error"
    assert st.index(1).num_rows == 5 and st.winners(1).num_rows == 3
    assert sorted(st.final_ids(1, 3).to_pylist()) == ["x", "y", "z"]
    assert st.error_runs(1).to_pylist() == [{"item_id": "x", "runs": 1}]


def test_a_jobs_items_are_judged_alone_with_the_same_rules(tmp_path):
    """`among`: a worker's job asks about its own items only (filtered before the sort), same answers."""
    import pyarrow as pa

    st = Store(tmp_path, "fp1")
    st.writer(1, "a").write([row("x", "error", t=1.0, kind="transient"), row("y", t=5.0), row("w", t=1.0)])
    st.writer(1, "b").write([row("x", t=9.0), row("y", t=2.0, tag="early"), row("z", "error", t=3.0, kind="permanent")])
    st.writer(1, "c").write([row("v", "error", t=float(i), kind="transient") for i in range(3)])
    among = pa.array(["x", "y", "v", "unknown"], pa.string())
    whole = st.winners(1)
    part = st.winners(1, among=among)
    assert part.to_pylist() == whole.filter(pa.compute.is_in(whole.column("item_id"), value_set=among)).to_pylist()
    assert sorted(st.settled(1, among=among).to_pylist()) == ["v", "x", "y"]  # v: out of re-attempts
    assert set(st.settled(1, among=among).to_pylist()) == set(st.settled(1).to_pylist()) & {"x", "y", "v"}
    assert st.error_runs(1, among=pa.array(["x"], pa.string())).to_pylist() == [{"item_id": "x", "runs": 1}]


def test_transient_errors_are_final_only_after_max_runs(tmp_path):
    st = Store(tmp_path, "fp1")
    w = st.writer(1, "a")
    w.write([row("x", "error", t=i, kind="transient") for i in range(2)])
    assert st.final_ids(1, 3).to_pylist() == []
    w.write([row("x", "error", t=3, kind="transient")])
    assert st.final_ids(1, 3).to_pylist() == ["x"]


def test_torn_last_line_is_skipped_with_a_warning(tmp_path, caplog):
    st = Store(tmp_path, "fp1")
    w = st.writer(1, "a")
    w.write([row("x"), row("y")])
    with w.path.open("ab") as f:
        f.write(b'{"item_id": "z", "status": "o')  # a crash mid-line
    old = time.time() - 120
    os.utime(w.path, (old, old))
    with caplog.at_level(logging.WARNING):
        assert sorted(st.winners(1).column("item_id").to_pylist()) == ["x", "y"]
    assert "incomplete last line" in caplog.text


def test_a_segment_is_parsed_a_piece_at_a_time_with_the_same_index(tmp_path, monkeypatch):
    """Pieces of CHUNK_BYTES keep a cold read of a large segment flat in memory; a line longer than a
    piece is read whole; the index is the one a single read gives."""
    from pool_queue.store import segment_index

    rows = [row(f"i{k:03d}", t=float(k), pad="x" * (900 if k == 7 else 10)) for k in range(40)]
    Store(tmp_path / "a", "fp1").writer(1, "w").write(rows)
    whole = Store(tmp_path / "a", "fp1").index(1).drop_columns(["segment"])
    (tmp_path / "a" / "step1" / ".index3").rename(tmp_path / "parts-of-one-read")
    monkeypatch.setattr(segment_index, "CHUNK_BYTES", 300)  # ~2 lines a piece; line 7 is longer than one
    pieces = Store(tmp_path / "a", "fp1").index(1).drop_columns(["segment"])
    assert pieces.to_pylist() == whole.to_pylist()
    (part,) = (tmp_path / "a" / "step1" / ".index3").iterdir()
    assert len(list(part.iterdir())) == 1  # more than MAX_PARTS pieces: compacted into one part


def test_threads_reading_one_store_together_parse_each_byte_once(tmp_path, monkeypatch):
    """A worker's threads re-check jobs at once after a recovery: each new byte is parsed by one of them,
    the others use its index (they used to parse it each, with a copy each)."""
    import threading

    from pool_queue.store import segment_index

    parsed: list[int] = []
    real = segment_index.SegmentIndex._parse

    def counted(self, seg_name, data, base):
        parsed.append(len(data))
        time.sleep(0.05)  # a slow parse: the other threads arrive while it runs
        return real(self, seg_name, data, base)

    monkeypatch.setattr(segment_index.SegmentIndex, "_parse", counted)
    w = Store(tmp_path, "fp1").writer(1, "a")
    st = Store(tmp_path, "fp1")
    for round_ in range(3):  # appended between rounds: each round parses only what is new, once
        w.write([row(f"r{round_}-{k}", t=float(k)) for k in range(50)])
        start = threading.Barrier(8)
        counts: list[int] = []

        def read(start: threading.Barrier = start, counts: list[int] = counts) -> None:
            start.wait()
            counts.append(st.index(1).num_rows)

        threads = [threading.Thread(target=read) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert counts == [50 * (round_ + 1)] * 8
    assert sum(parsed) == w.path.stat().st_size and len(parsed) == 3


def test_damaged_line_in_the_middle_is_skipped(tmp_path, caplog):
    st = Store(tmp_path, "fp1")
    d = tmp_path / "step1"
    d.mkdir(parents=True)
    (d / "seg-x.jsonl").write_bytes(orjson.dumps(row("a")) + b"\n{broken\n" + orjson.dumps(row("b")) + b"\n")
    with caplog.at_level(logging.WARNING):
        got = st.read_rows(1, st.winners(1))
    assert [r["item_id"] for r in got] == ["a", "b"] and "unparsable" in caplog.text


def test_index_is_incremental_and_survives_compaction(tmp_path):
    st = Store(tmp_path, "fp1")
    w = st.writer(1, "a")
    for i in range(40):  # 40 appends, each re-read: more parts than MAX_PARTS forces a compaction
        w.write([row(f"i{i}")])
        assert st.index(1).num_rows == i + 1
    parts = list((tmp_path / "step1" / ".index3").rglob("*.parquet"))
    assert len(parts) <= 17
    fresh = Store(tmp_path, "fp1")
    assert fresh.index(1).num_rows == 40 and fresh.winners(1).num_rows == 40


def test_other_protocol_is_refused(tmp_path):
    Store(tmp_path, "fp1").writer(1, "a").write([row("x")])
    with pytest.raises(StoreError, match="start a new results root"):
        Store(tmp_path, "fp2").claim()
    # a stray row of another protocol in the right root is refused too
    Store(tmp_path, "fp1").writer(1, "b").write([row("y", fp="fp9")])
    with pytest.raises(StoreError, match="another protocol"):
        Store(tmp_path, "fp1").winners(1)


def _claim_fresh(root: str, start: Any) -> None:
    start.wait()  # every process claims at the same moment
    Store(Path(root), "fp1", {"pad": "x" * 20_000_000}).claim()  # a large stamp: a slow write


def test_workers_starting_together_on_a_fresh_root_all_see_a_whole_stamp(tmp_path):
    # a stamp created empty and then written let a second worker read "" and die (seen in CI)
    ctx = mp.get_context("fork")
    for k in range(3):
        root = tmp_path / f"r{k}"
        start = ctx.Barrier(6)
        ps = [ctx.Process(target=_claim_fresh, args=(str(root), start)) for _ in range(6)]
        for p in ps:
            p.start()
        for p in ps:
            p.join(30)
        assert [p.exitcode for p in ps] == [0] * 6
        assert orjson.loads((root / STAMP).read_bytes())["fingerprint"] == "fp1"
        assert [f.name for f in root.iterdir()] == [STAMP]  # no private copies left behind


def test_the_arrow_schema_is_the_row_model():
    """One row schema: the export's Arrow fields are the pydantic row's, in order, nothing more."""
    assert ROW_SCHEMA.names == list(Row.model_fields)
    forward = ROW_SCHEMA.field("forwards").type.value_type
    assert [forward.field(i).name for i in range(forward.num_fields)] == list(ForwardRecord.model_fields)


def _write_past_a_file_size_limit(root: str, q: Any) -> None:
    """In its own process: the file-size limit would otherwise bind the test runner's own files."""
    import resource

    from pool_queue.store.store import StoreWriteError

    w = Store(Path(root), "fp1").writer(1, "w")
    w.write([row("a")])
    first, good = w.path, w.path.stat().st_size
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (good + 10, hard))  # the next batch fits only in part
    try:
        w.write([row("b"), row("c")])
        q.put("written")
    except StoreWriteError as e:
        q.put((str(e.strerror), first.stat().st_size == good, e.nbytes > 10))
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, hard))
    w.write([row("b"), row("c")])
    q.put(w.path != first)


def test_a_batch_the_disk_refuses_is_cut_back_and_the_next_goes_to_a_new_segment(tmp_path):
    q: Any = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=_write_past_a_file_size_limit, args=(str(tmp_path), q))
    p.start()
    p.join(60)
    why, cut_back, sized = q.get(timeout=5)
    assert why.startswith(f"cannot write rows to {tmp_path / 'step1'}: File too large") and cut_back and sized
    assert q.get(timeout=5)  # a fresh segment after the failure
    for seg in Store(tmp_path, "fp1").segments(1):  # whole lines only: no reader meets a torn one
        assert seg.read_bytes().endswith(b"\n")
    got = Store(tmp_path, "fp1").winners(1).column("item_id").to_pylist()
    assert sorted(got) == ["a", "b", "c"]


def test_a_step_folder_that_refuses_files_fails_the_first_write_not_the_writer(tmp_path):
    """The worker makes its writer before its first batch: a folder it cannot create files in (read-only,
    here a file standing where the folder goes, which refuses root too) is the batch's StoreWriteError, the
    worker's hold, and not an exception at the writer's creation that would fail the job."""
    from pool_queue.store.store import StoreWriteError

    st = Store(tmp_path, "fp1")
    st.claim()
    st.step_dir(1).write_bytes(b"")  # no folder can be made here
    w = st.writer(1, "w")
    with pytest.raises(StoreWriteError, match=f"cannot write rows to {st.step_dir(1)}"):
        w.write([row("a")])
    st.step_dir(1).unlink()  # the folder can be made again
    w.write([row("a")])
    assert st.winners(1).column("item_id").to_pylist() == ["a"]
