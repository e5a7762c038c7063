"""The append-only result store: the source of truth (Redis only holds the work queue).

Layout under the results root: `step{N}/seg-<writer>.jsonl`, one segment per writer process, so
no two processes append to one file; a batch of rows is written, flushed and fsynced before its
job is acknowledged. Readers keep a column index per segment (`step{N}/.index2/`, Parquet) that
covers the bytes already parsed, so a re-read parses only what was appended since. Duplicates
(a job re-run after a crash) are resolved at read time: per (step, item_id) an ok row beats an
error row, and among equals the earliest wins.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from .errors import InputError
from .rows import FINAL_ERRORS

log = logging.getLogger(__name__)

STAMP = "PROTOCOL.json"
STEPS = (1, 2, 3)
INDEX_FIELDS = pa.schema(
    [
        ("item_id", pa.string()),
        ("benchmark", pa.string()),
        ("status", pa.string()),
        ("error_kind", pa.string()),
        ("removed", pa.bool_()),
        ("started_at", pa.float64()),
        ("finished_at", pa.float64()),
        ("fingerprint", pa.string()),
        ("pred", pa.string()),
        ("margin", pa.float64()),
        ("n_hits", pa.int64()),
        ("n_perm", pa.int64()),
        ("attempts", pa.int64()),
        ("server", pa.string()),
    ]
)
INDEX_SCHEMA = pa.schema([*INDEX_FIELDS, ("segment", pa.string()), ("offset", pa.int64()), ("length", pa.int64())])
MAX_PARTS = 16
INDEX_DIR = ".index2"  # named for its schema: an index of another schema is rebuilt, never misread
MAX_ITEM_RUNS = 3  # a later run re-attempts transient error rows until an item has this many


class StoreError(InputError, RuntimeError):
    pass


class Store:
    def __init__(self, root: Path, fingerprint: str, protocol: dict[str, Any] | None = None) -> None:
        self.root = root
        self.fingerprint = fingerprint
        self._protocol = protocol
        self._warned: set[str] = set()
        self._seen: dict[Path, tuple[int, pa.Table, int]] = {}  # segment -> (bytes covered, index, parts)

    # ---- protocol stamp -------------------------------------------------------------------------

    def claim(self) -> None:
        """Stamp an empty root with our protocol, or check the stamp; refuse a different protocol."""
        self.root.mkdir(parents=True, exist_ok=True)
        stamp = self.root / STAMP
        body = orjson.dumps(
            {"fingerprint": self.fingerprint, "screen_token": uuid.uuid4().hex, "protocol": self._protocol},
            option=orjson.OPT_INDENT_2,
        )
        if not stamp.exists():
            # written whole under a private name, then linked: a worker starting beside us sees no
            # stamp or a complete one, never an empty file; the first link wins
            tmp = self.root / f".{STAMP}.{socket.gethostname()}.{os.getpid()}.{time.monotonic_ns()}"
            with open(tmp, "wb") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            try:
                with contextlib.suppress(FileExistsError):
                    os.link(tmp, stamp)
            finally:
                tmp.unlink()
        self.check_stamp()

    def screen_token(self) -> str | None:
        """A token made once with the stamp (None before anything stamped the root): the queue names its
        screen after it, so every mount of one root (container or host) is one screen."""
        stamp = self.root / STAMP
        if not stamp.exists():
            return None
        self.check_stamp()
        return str(orjson.loads(stamp.read_bytes()).get("screen_token") or "stamped-before-screen-tokens")

    def check_stamp(self) -> None:
        stamp = self.root / STAMP
        if not stamp.exists():
            return
        theirs = orjson.loads(stamp.read_bytes()).get("fingerprint")
        if theirs != self.fingerprint:
            raise StoreError(
                f"results root {self.root} holds rows of protocol {theirs}, this run uses {self.fingerprint}; "
                "rows of different protocols are never mixed: start a new results root (--results DIR)"
            )

    # ---- writing --------------------------------------------------------------------------------

    def writer(self, step: int, name: str) -> SegmentWriter:
        self.claim()
        return SegmentWriter(self.root / f"step{step}", name)

    # ---- reading --------------------------------------------------------------------------------

    def segments(self, step: int) -> list[Path]:
        d = self.root / f"step{step}"
        return sorted(d.glob("*.jsonl")) if d.is_dir() else []

    def index(self, step: int) -> pa.Table:
        """Every row of a step (duplicates included), as INDEX_SCHEMA columns."""
        parts = [self._segment_index(seg) for seg in self.segments(step)]
        table = pa.concat_tables(parts) if parts else INDEX_SCHEMA.empty_table()
        bad = pc.not_equal(table.column("fingerprint"), self.fingerprint)
        if table.num_rows and pc.any(bad).as_py():
            seg = pc.filter(table.column("segment"), bad)[0].as_py()
            raise StoreError(f"step {step}: rows of another protocol in {seg}; start a new results root")
        return table

    def winners(self, step: int) -> pa.Table:
        """One row per item: ok beats error, then the earliest (finished_at, segment, offset)."""
        t = self.index(step)
        if not t.num_rows:
            return t
        rank = pc.if_else(pc.equal(t.column("status"), "ok"), 0, 1)
        t = t.append_column("_rank", rank).sort_by(
            [
                ("item_id", "ascending"),
                ("_rank", "ascending"),
                ("finished_at", "ascending"),
                ("segment", "ascending"),
                ("offset", "ascending"),
            ]
        )
        ids = t.column("item_id").combine_chunks()
        first = np.ones(len(ids), dtype=bool)
        if len(ids) > 1:
            first[1:] = pc.not_equal(ids.slice(1), ids.slice(0, len(ids) - 1)).to_numpy(zero_copy_only=False)
        return t.filter(pa.array(first)).drop_columns(["_rank"])

    def error_runs(self, step: int) -> pa.Table:
        """Per item, how many transient error rows it has (for the re-attempt limit)."""
        t = self.index(step)
        final = pc.is_in(t.column("error_kind"), value_set=pa.array(FINAL_ERRORS))
        t = t.filter(pc.and_(pc.equal(t.column("status"), "error"), pc.invert(pc.fill_null(final, False))))
        return t.group_by("item_id").aggregate([("item_id", "count")]).rename_columns(["item_id", "runs"])

    def settled(self, step: int) -> pa.Array:
        """Items this step needs no more work on, under the re-attempt limit every reader shares."""
        return self.final_ids(step, MAX_ITEM_RUNS)

    def final_ids(self, step: int, max_item_runs: int) -> pa.Array:
        """Items this step needs no more work on: ok, failed for good (refused, bad input), or out of re-attempts."""
        w = self.winners(step)
        st, kind = w.column("status"), pc.fill_null(w.column("error_kind"), "")
        settled = pc.or_(pc.equal(st, "ok"), pc.is_in(kind, value_set=pa.array(FINAL_ERRORS)))
        done = pc.filter(w.column("item_id"), settled)
        runs = self.error_runs(step)
        spent = pc.filter(runs.column("item_id"), pc.greater_equal(runs.column("runs"), max_item_runs))
        return pa.chunked_array([done.combine_chunks(), spent.combine_chunks()], pa.string()).combine_chunks()

    def read_rows(self, step: int, index: pa.Table) -> list[dict[str, Any]]:
        """Full rows for the index entries given (e.g. the winners), read by offset."""
        out: list[dict[str, Any]] = []
        by_seg: dict[str, list[tuple[int, int]]] = {}
        for seg, off, n in zip(
            index.column("segment").to_pylist(),
            index.column("offset").to_pylist(),
            index.column("length").to_pylist(),
            strict=True,
        ):
            by_seg.setdefault(seg, []).append((off, n))
        for seg, spans in by_seg.items():
            with (self.root / f"step{step}" / seg).open("rb") as f:
                for off, n in spans:
                    f.seek(off)
                    out.append(orjson.loads(f.read(n)))
        return out

    # ---- the incremental index ------------------------------------------------------------------

    def _segment_index(self, seg: Path) -> pa.Table:
        """Kept in memory too, so a live view re-reading every few seconds parses only new bytes."""
        size = seg.stat().st_size
        idx_dir = seg.parent / INDEX_DIR / seg.stem
        if seg in self._seen:
            covered, table, n_parts = self._seen[seg]
            if size == covered:
                return table
            tables = [table]
        else:
            tables, covered = self._load_parts(idx_dir)
            n_parts = len(tables)
        if size > covered:
            with seg.open("rb") as f:
                f.seek(covered)
                data = f.read(size - covered)
            end = data.rfind(b"\n") + 1
            if end < len(data):
                self._warn_torn(seg, covered + end, len(data) - end)
            if end:
                new = self._parse(seg.name, data[:end], covered)
                tables.append(new)
                self._save_part(idx_dir, covered, covered + end, new)
                covered += end
                n_parts += 1
        table = pa.concat_tables(tables) if tables else INDEX_SCHEMA.empty_table()
        if n_parts > MAX_PARTS:
            self._compact(idx_dir, table, covered)
            n_parts = 1
        self._seen[seg] = (covered, table, n_parts)
        return table

    @staticmethod
    def _load_parts(idx_dir: Path) -> tuple[list[pa.Table], int]:
        """The chain of index parts from byte 0; a part that does not continue the chain is ignored."""
        spans = []
        for p in idx_dir.glob("*.parquet") if idx_dir.is_dir() else []:
            lo, _, hi = p.stem.partition("-")
            spans.append((int(lo), -int(hi), p))
        tables: list[pa.Table] = []
        covered = 0
        for start, neg_b, p in sorted(spans):
            if start == covered:
                try:
                    tables.append(pq.read_table(p, schema=INDEX_SCHEMA))
                except (OSError, pa.ArrowInvalid):
                    break
                covered = -neg_b
        return tables, covered

    def _warn_torn(self, seg: Path, at: int, n: int) -> None:
        key = f"{seg}:{at}"
        if key not in self._warned and time.time() - seg.stat().st_mtime > 30:
            self._warned.add(key)
            log.warning("%s: skipping an incomplete last line (%d bytes at offset %d), left by a crash", seg, n, at)

    def _parse(self, seg_name: str, data: bytes, base: int) -> pa.Table:
        nl = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
        starts = np.concatenate(([0], nl[:-1] + 1))
        lengths = nl - starts
        opts = pajson.ParseOptions(explicit_schema=INDEX_FIELDS, unexpected_field_behavior="ignore")
        try:
            t = pajson.read_json(
                io.BytesIO(data),
                parse_options=opts,
                read_options=pajson.ReadOptions(block_size=max(1 << 20, int(lengths.max()) + 2)),
            )
            keep = np.ones(len(starts), dtype=bool)
        except pa.ArrowInvalid:
            t, keep = self._parse_lines(seg_name, data, starts, lengths)
        n = t.num_rows
        return pa.table(
            {
                **{f.name: t.column(f.name) for f in INDEX_FIELDS},
                "segment": pa.array([seg_name] * n, pa.string()),
                "offset": pa.array(starts[keep] + base, pa.int64()),
                "length": pa.array(lengths[keep], pa.int64()),
            },
            schema=INDEX_SCHEMA,
        )

    def _parse_lines(
        self, seg_name: str, data: bytes, starts: np.ndarray, lengths: np.ndarray
    ) -> tuple[pa.Table, np.ndarray]:
        """Slow path for a block with a damaged line: parse line by line and skip what is broken."""
        rows, keep = [], np.zeros(len(starts), dtype=bool)
        for i, (s, n) in enumerate(zip(starts.tolist(), lengths.tolist(), strict=True)):
            try:
                r = orjson.loads(data[s : s + n])
                rows.append({f.name: r.get(f.name) for f in INDEX_FIELDS})
                keep[i] = True
            except orjson.JSONDecodeError:
                log.warning("%s: skipping an unparsable line at offset %d", seg_name, s)
        return pa.Table.from_pylist(rows, schema=INDEX_FIELDS), keep

    @staticmethod
    def _save_part(idx_dir: Path, start: int, end: int, table: pa.Table) -> None:
        """Best effort: a reader without write access simply parses again next time."""
        try:
            idx_dir.mkdir(parents=True, exist_ok=True)
            tmp = idx_dir / f".{start}-{end}.tmp"
            pq.write_table(table, tmp)
            tmp.rename(idx_dir / f"{start}-{end}.parquet")
        except OSError:
            pass

    def _compact(self, idx_dir: Path, table: pa.Table, covered_end: int) -> None:
        old = list(idx_dir.glob("*.parquet"))
        self._save_part(idx_dir, 0, covered_end, table)
        for p in old:
            if p.name != f"0-{covered_end}.parquet":
                with contextlib.suppress(OSError):
                    p.unlink()


class SegmentWriter:
    """Appends rows to this process's own segment; `write` returns once they are on disk."""

    def __init__(self, step_dir: Path, name: str) -> None:
        step_dir.mkdir(parents=True, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        self.path = step_dir / f"seg-{safe}-{socket.gethostname()}-{os.getpid()}-{stamp}.jsonl"
        self._f = self.path.open("ab")

    def write(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        self._f.write(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> SegmentWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
