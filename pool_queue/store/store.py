"""The append-only result store: the source of truth (Redis only holds the work queue).

Layout under the results root: `step{N}/seg-<writer>.jsonl`, one segment per writer process, so
no two processes append to one file; a batch of rows is written, flushed and fsynced before its
job is acknowledged. Readers keep a column index per segment (`segment_index`), so a re-read
parses only what was appended since. Duplicates (a job re-run after a crash) are resolved at read
time: per (step, item_id) an ok row beats an error row, and among equals the earliest wins.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import StoreError, folder_trouble
from ..rows import FINAL_ERRORS
from ..text import printable_tree
from .segment_index import INDEX_SCHEMA, SegmentIndex

log = logging.getLogger(__name__)
STAMP = "PROTOCOL.json"
MAX_ITEM_RUNS = 3  # a later run re-attempts transient error rows until an item has this many
PROBE_MAX_BYTES = 4 << 20  # a held writer's probe writes the refused batch's size, up to this


class Store:
    def __init__(
        self,
        root: Path,
        fingerprint: str,
        protocol: dict[str, Any] | None = None,
        named: str = "--results or POOL_RESULTS",
    ) -> None:
        """`named`: the setting that chose the root, as an error names it (Settings.results_named). A file in the
        root's place is refused here, by every command: one that only reads would see an empty screen."""
        self.root = root
        self.named = named
        if root.exists() and not root.is_dir():
            raise self._unusable(OSError(errno.EEXIST, "File exists"))
        self.fingerprint = fingerprint
        self._protocol = protocol
        self._index = SegmentIndex()
        self.torn = TornTails()  # this process's failed writes whose partial line is still to be cut

    # ---- protocol stamp -------------------------------------------------------------------------

    def claim(self) -> None:
        """Stamp an empty root with our protocol, or check the stamp; refuse a different protocol. A root that
        cannot be made or written is one line naming its setting and why (StoreError), before any work."""
        try:
            self._stamp()
        except OSError as e:
            raise self._unusable(e) from None
        self.check_stamp()

    def _unusable(self, e: OSError) -> StoreError:
        return StoreError(f"results folder {self.root} ({self.named}) {folder_trouble(self.root, e)}: fix that, or "
                          "choose another results folder (--results DIR or POOL_RESULTS)")  # fmt: skip

    def _stamp(self) -> None:
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

    def require_screen(self, doing: str) -> None:
        """Refuse a root that holds no screen for a command that reads one (`doing`: "report", "export"): a
        mistyped --results would otherwise read as an empty screen, and a report written from it would
        replace the real one."""
        if (self.root / STAMP).is_file():
            self.check_stamp()
            return
        what = "holds no screen" if self.root.is_dir() else "does not exist"
        raise StoreError(f"nothing to {doing}: results folder {self.root} ({self.named}) {what} "
                         "(check --root / --results)")  # fmt: skip

    def screen_token(self) -> str | None:
        """A token made once with the stamp (None before anything stamped the root): the queue names its
        screen after it, so every mount of one root (container or host) is one screen."""
        stamp = self.root / STAMP
        if not stamp.exists():
            return None
        self.check_stamp()
        return str(self._read_stamp().get("screen_token") or "stamped-before-screen-tokens")

    def _read_stamp(self) -> dict[str, Any]:
        """The stamp's fields; a stamp that is not a JSON object (cut, edited) is one line naming it."""
        stamp = self.root / STAMP
        try:
            body = orjson.loads(stamp.read_bytes())
        except orjson.JSONDecodeError as e:
            raise StoreError(f"{stamp} is not valid JSON ({e}): a damaged stamp; restore it from a copy of the "
                             "results root, or start a new results root (--results DIR)") from None  # fmt: skip
        if not isinstance(body, dict):
            raise StoreError(f"{stamp} is not a JSON object: restore it, or start a new results root (--results DIR)")
        return body

    def check_stamp(self) -> None:
        stamp = self.root / STAMP
        if not stamp.exists():
            return
        theirs = self._read_stamp().get("fingerprint")
        if theirs != self.fingerprint:
            raise StoreError(
                f"results root {self.root} holds rows of protocol {theirs}, this run uses {self.fingerprint}; "
                "rows of different protocols are never mixed: start a new results root (--results DIR)"
            )

    # ---- writing --------------------------------------------------------------------------------

    def step_dir(self, step: int) -> Path:
        return self.root / f"step{step}"

    def writer(self, step: int, name: str) -> SegmentWriter:
        self.claim()
        return SegmentWriter(self.step_dir(step), name, self.torn)

    # ---- reading --------------------------------------------------------------------------------

    def segments(self, step: int) -> list[Path]:
        d = self.step_dir(step)
        return sorted(d.glob("*.jsonl")) if d.is_dir() else []

    def index(self, step: int) -> pa.Table:
        """Every row of a step (duplicates included), as INDEX_SCHEMA columns."""
        parts = [self._index.read(seg) for seg in self.segments(step)]
        table = pa.concat_tables(parts) if parts else INDEX_SCHEMA.empty_table()
        bad = pc.not_equal(table.column("fingerprint"), self.fingerprint)
        if table.num_rows and pc.any(bad).as_py():
            seg = pc.filter(table.column("segment"), bad)[0].as_py()
            raise StoreError(f"step {step}: rows of another protocol in {seg}; start a new results root")
        return table

    def winners(self, step: int, among: pa.Array | None = None) -> pa.Table:
        """One row per item: ok beats error, then the earliest (finished_at, segment, offset). `among`: only
        these items (a worker's job), found by a filter before the sort, so a job costs what it holds."""
        t = self._index_of(step, among)
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

    def error_runs(self, step: int, among: pa.Array | None = None) -> pa.Table:
        """Per item, how many transient error rows it has (for the re-attempt limit)."""
        t = self._index_of(step, among)
        final = pc.is_in(t.column("error_kind"), value_set=pa.array(FINAL_ERRORS))
        t = t.filter(pc.and_(pc.equal(t.column("status"), "error"), pc.invert(pc.fill_null(final, False))))
        return t.group_by("item_id").aggregate([("item_id", "count")]).rename_columns(["item_id", "runs"])

    def settled(self, step: int, among: pa.Array | None = None) -> pa.Array:
        """Items this step needs no more work on, under the re-attempt limit every reader shares."""
        return self.final_ids(step, MAX_ITEM_RUNS, among)

    def final_ids(self, step: int, max_item_runs: int, among: pa.Array | None = None) -> pa.Array:
        """Items this step needs no more work on: ok, failed for good (refused, bad input), or out of re-attempts."""
        w = self.winners(step, among)
        st, kind = w.column("status"), pc.fill_null(w.column("error_kind"), "")
        settled = pc.or_(pc.equal(st, "ok"), pc.is_in(kind, value_set=pa.array(FINAL_ERRORS)))
        done = pc.filter(w.column("item_id"), settled)
        runs = self.error_runs(step, among)
        spent = pc.filter(runs.column("item_id"), pc.greater_equal(runs.column("runs"), max_item_runs))
        return pa.chunked_array([done.combine_chunks(), spent.combine_chunks()], pa.string()).combine_chunks()

    def _index_of(self, step: int, among: pa.Array | None) -> pa.Table:
        t = self.index(step)
        return t if among is None else t.filter(pc.is_in(t.column("item_id"), value_set=among))

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
            with (self.step_dir(step) / seg).open("rb") as f:
                for off, n in spans:
                    f.seek(off)
                    out.append(orjson.loads(f.read(n)))
        return out


class TornTails:
    """Partial lines that failed writes left at the end of this process's segments because the disk refused
    the cut-back too (a filesystem turned read-only mid-write). `repair` cuts each back to its last whole
    line once writes work again: the worker calls it before it takes work. Whole lines of the failed batch
    stay, as after a crash: another worker may already have read them and skipped their items."""

    def __init__(self) -> None:
        self._left: dict[Path, int] = {}  # segment -> where the failed batch began
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._left)

    def add(self, seg: Path, start: int, err: OSError) -> None:
        with self._lock:
            self._left.setdefault(seg, start)
        log.warning(
            "%s: a failed write's bytes from offset %d could not be cut back (%s); they are cut once writes work again",
            seg,
            start,
            err.strerror or err,
        )

    def repair(self) -> bool:
        """Cut what can be cut now; True when nothing is left."""
        with self._lock:
            for seg, start in list(self._left.items()):
                try:
                    _cut_to_last_line(seg, start)
                except FileNotFoundError:
                    pass  # moved away or removed: nothing left to cut here
                except OSError:
                    continue
                del self._left[seg]
            return not self._left


def _cut_to_last_line(seg: Path, start: int) -> None:
    fd = os.open(seg, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        tail = os.pread(fd, size - start, start) if size > start else b""
        keep = start + tail.rfind(b"\n") + 1
        if keep < size:
            os.ftruncate(fd, keep)
            os.fsync(fd)
            log.warning("%s: cut a failed write's partial line (%d bytes at offset %d)", seg, size - keep, keep)
    finally:
        os.close(fd)


class StoreWriteError(OSError):
    """Rows could not be put on disk (full, read-only or over a size limit): nothing of the batch is left
    behind (or, where the disk refused the cut-back too, in `torn` to be cut before the worker takes work
    again), and the job that made them must not be acknowledged."""

    def __init__(self, err: OSError, writer: SegmentWriter, nbytes: int) -> None:
        super().__init__(err.errno, f"cannot write rows to {writer.step_dir}: {err.strerror or err}")
        self.folder = writer.step_dir
        self.nbytes = nbytes
        self.torn = writer.torn
        self._writer = writer

    def cleared(self) -> bool:
        """Whether the refused write would go through now, and the partial lines that refused cut-backs left
        are cut (only then is the hold over: no torn tail outlives the outage)."""
        return self._writer.fits(self.nbytes) and self.torn.repair()


class SegmentWriter:
    """Appends rows to this process's own segment; `write` returns once they are on disk.

    Unbuffered: a failed write leaves nothing in a buffer to be flushed later, and the segment is cut
    back to its last whole batch, so no reader ever meets a torn line between two rows. After a failure
    the next batch goes to a fresh segment. A cut-back the disk refuses too leaves a partial last line,
    which readers skip at a segment's end, until `torn.repair()` cuts it."""

    def __init__(self, step_dir: Path, name: str, torn: TornTails | None = None) -> None:
        self.step_dir = step_dir
        self.safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        self.torn = torn if torn is not None else TornTails()
        self._fd: int | None = None
        # one batch at a time: a batch appended while another's failed write is cut back would be cut with it
        self._lock = threading.Lock()
        self.path = step_dir  # set by _open
        with contextlib.suppress(OSError):  # a folder that refuses files: the first write says so
            self.path = self._open()

    def _open(self) -> Path:
        self.step_dir.mkdir(parents=True, exist_ok=True)  # a step's first rows make its folder
        stamp = f"{time.strftime('%Y%m%dT%H%M%S')}-{time.monotonic_ns() % 10**9:09d}"  # a re-open is a new file
        path = self.step_dir / f"seg-{self.safe}-{socket.gethostname()}-{os.getpid()}-{stamp}.jsonl"
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return path

    def write(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        with self._lock:
            self._write(memoryview(b"".join(_line(r) for r in rows)))

    def _write(self, data: memoryview) -> None:
        size = len(data)
        try:
            if self._fd is None:
                self.path = self._open()
            fd = self._fd
            assert fd is not None
            good = os.fstat(fd).st_size
            try:
                while data:
                    data = data[os.write(fd, data) :]
                os.fsync(fd)
            except OSError:
                try:
                    os.ftruncate(fd, good)
                except OSError as cut:
                    self.torn.add(self.path, good, cut)
                self._drop()
                raise
        except OSError as e:
            raise StoreWriteError(e, self, size) from e

    def fits(self, nbytes: int) -> bool:
        """Whether a batch of `nbytes` would be written now, tried by the steps a write after a failure takes
        (its folder made if missing, a new file made in it, the bytes written and synced) on a probe file that
        is removed again. A probe that skipped a step could fail for ever once the disk is back (a folder the
        outage kept from being made) or pass while the write would still fail."""
        probe = self.step_dir / f".probe-{self.safe}"
        try:
            self.step_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                data = memoryview(bytes(min(nbytes, PROBE_MAX_BYTES)))
                while data:
                    data = data[os.write(fd, data) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            return True
        except OSError:
            return False
        finally:
            with contextlib.suppress(OSError):
                probe.unlink()

    def close(self) -> None:
        """And a last try at the partial lines left, for a worker that stops while held."""
        with self._lock:
            self._drop()
        self.torn.repair()

    def _drop(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self) -> SegmentWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _line(row: dict[str, Any]) -> bytes:
    """One row as a JSON line; text that is not valid UTF-8 (a file name, an exception) is escaped, never
    a failed write."""
    try:
        return orjson.dumps(row) + b"\n"
    except TypeError:
        return orjson.dumps(printable_tree(row)) + b"\n"
