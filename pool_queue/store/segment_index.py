"""The readers' column index of a store segment: `step{N}/.index3/<segment>/<start>-<end>.parquet`.

Each part covers a byte span of its segment, parsed once with pyarrow's JSON reader, so a re-read
parses only what was appended since (a live `pool-status` every few seconds, a report over 300,000
rows). The parts are a cache: one that is missing, unreadable or of another schema is parsed again,
and a reader without write access simply keeps its parts in memory.
"""

from __future__ import annotations

import contextlib
import io
import logging
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from ..rows import ROW_SCHEMA

log = logging.getLogger(__name__)

# The row fields readers select and sort on, typed as the row schema types them (one schema, rows.py).
INDEX_COLUMNS = ("item_id", "benchmark", "status", "error_kind", "removed", "started_at", "finished_at",
                 "fingerprint", "pred", "margin", "n_hits", "n_perm", "attempts", "server")  # fmt: skip
INDEX_FIELDS = pa.schema([ROW_SCHEMA.field(name) for name in INDEX_COLUMNS])
INDEX_SCHEMA = pa.schema([*INDEX_FIELDS, ("segment", pa.string()), ("offset", pa.int64()), ("length", pa.int64())])
MAX_PARTS = 16
CHUNK_BYTES = 64 << 20  # parsed at once: a 299,366-item step 1 is ~1.4 GB of rows
INDEX_DIR = ".index3"  # named for its schema: an index of another schema is rebuilt, never misread
INDEX_DIR_PREFIX = ".index"  # every version's, e.g. the .index2 an earlier release left beside the rows


class SegmentIndex:
    def __init__(self) -> None:
        self._warned: set[str] = set()
        self._seen: dict[Path, tuple[int, pa.Table, int]] = {}  # segment -> (bytes covered, index, parts)
        self._lock = threading.Lock()

    def read(self, seg: Path) -> pa.Table:
        """Kept in memory too, so a live view re-reading every few seconds parses only new bytes. One read at a
        time: threads reading together would each parse the same new bytes and keep their own copies."""
        with self._lock:
            return self._read(seg)

    def _read(self, seg: Path) -> pa.Table:
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
        with seg.open("rb") if size > covered else contextlib.nullcontext() as f:
            while f is not None and size > covered:  # a piece at a time: memory stays flat at any size
                f.seek(covered)
                data = f.read(min(size - covered, CHUNK_BYTES))
                end = data.rfind(b"\n") + 1
                while end == 0 and covered + len(data) < size:  # a line longer than a piece: read on to its end
                    data += f.read(min(size - covered - len(data), CHUNK_BYTES))
                    end = data.rfind(b"\n") + 1
                if end < len(data) and covered + len(data) == size:
                    self._warn_torn(seg, covered + end, len(data) - end)
                if not end:
                    break
                new = self._parse(seg.name, data[:end], covered)
                tables.append(new)
                self._save_part(idx_dir, covered, covered + end, new)
                covered += end
                n_parts += 1
        table = pa.concat_tables(tables) if tables else INDEX_SCHEMA.empty_table()
        if n_parts > MAX_PARTS:  # on disk one part, in memory one chunk: a long-lived reader's table
            table = table.combine_chunks()  # would otherwise gain a chunk per read, each read slower
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
            log.warning(
                "%s: skipping an incomplete last line (%d bytes at offset %d), left by a crash or a write the disk "
                "refused",
                seg,
                n,
                at,
            )

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
        for i, (start, length) in enumerate(zip(starts.tolist(), lengths.tolist(), strict=True)):
            try:
                row = orjson.loads(data[start : start + length])
                rows.append({f.name: row.get(f.name) for f in INDEX_FIELDS})
                keep[i] = True
            except orjson.JSONDecodeError:
                log.warning("%s: skipping an unparsable line at offset %d", seg_name, start)
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
