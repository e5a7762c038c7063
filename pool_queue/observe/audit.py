"""Audit a results root before it is packed: what users will read must be whole and consistent.

Problems (non-zero exit): a row that does not parse or validate, a torn line, rows of more than
one protocol, a step-1 ok row without its orders, duplicate ok rows that disagree, a step-2 row
for an item that was not a step-1 survivor with frames, a step-3 row for an item that was not a
step-2 survivor, rows for unknown items. Warnings: repeated rows that agree (a crash repeat,
resolved at read time), steps not finished yet, and survivors never screened by a step with frames
because their video is not `k:` and the frame cache is absent, empty or short of its manifest
(`plan.cache_shortfall`); the last two are problems with `complete=True` (frames: unless
`allow_missing_frames`). Survivors of `k:` videos are no finding: they have no frames by design.
`audit_results` audits the root that the settings name; `summary` is the findings as pool-audit prints them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import ValidationError

from ..cli import fail, load_protocol
from ..inputs.items import ItemSet, load_items
from ..jobs.plan import cache_shortfall, eligible, frameless
from ..proc.progress import byte_progress
from ..protocol import Protocol
from ..rows import Row
from ..settings import Settings
from ..store.store import STAMP, Store

EXAMPLES = 5


@dataclass(frozen=True)
class Finding:
    check: str
    detail: str
    examples: tuple[str, ...] = ()


@dataclass
class Audit:
    rows: int = 0
    segments: int = 0
    problems: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    fingerprints: Counter[str] = field(default_factory=Counter)

    def problem(self, check: str, detail: str, examples: list[str] | None = None) -> None:
        self.problems.append(Finding(check, detail, tuple((examples or [])[:EXAMPLES])))

    def warn(self, check: str, detail: str, examples: list[str] | None = None) -> None:
        self.warnings.append(Finding(check, detail, tuple((examples or [])[:EXAMPLES])))


def run_audit(
    root: Path,
    protocol: Protocol,
    items: ItemSet,
    frames_dir: Path,
    complete: bool = False,
    show: bool = True,
    tar_dir: Path | None = None,
    allow_missing_frames: bool = False,
) -> Audit:
    """The audit of a results root; `tar_dir`: the frame shards' folder, whose manifest tells a cache short of
    its videos from one whole per its snapshot (None: no manifest to go by)."""
    audit = Audit()
    segs = [(step, seg) for step in sorted(protocol.steps) for seg in Store(root, protocol.fingerprint).segments(step)]
    audit.segments = len(segs)
    with byte_progress("audit: rows", sum(p.stat().st_size for _, p in segs), show) as advance:
        for step, seg in segs:
            _scan(audit, step, seg, protocol, advance)
    _check_fingerprints(audit, root, protocol)
    if audit.problems and any(f.check == "protocol" for f in audit.problems):
        return audit  # the store refuses mixed protocols: the checks below need one
    store = Store(root, protocol.fingerprint)
    known = items.items.column("item_id")
    for step in sorted(protocol.steps):
        idx = store.index(step)
        _check_duplicates(audit, step, idx)
        unknown = pc.filter(idx.column("item_id"), pc.invert(pc.is_in(idx.column("item_id"), value_set=known)))
        if len(unknown):
            audit.problem(
                "unknown items",
                f"step {step}: {len(unknown)} rows for items not in the item table",
                unknown.to_pylist(),
            )
        elig = eligible(protocol, step, items.items, store, frames_dir).column("item_id")
        if (prev := protocol.prev_step(step)) is not None:
            stray = pc.filter(idx.column("item_id"), pc.invert(pc.is_in(idx.column("item_id"), value_set=elig)))
            stray = pc.filter(stray, pc.is_in(stray, value_set=known))
            if len(stray):
                frames = " with frames" if protocol.steps[step].frames != "none" else ""
                why = f"step-{prev} survivors{frames}"
                audit.problem(
                    "chain", f"step {step}: {len(stray)} rows for items that are not {why}", stray.to_pylist()
                )
            bare = frameless(protocol, step, items.items, store, frames_dir)
            if bare.other and (short := cache_shortfall(frames_dir, tar_dir)) is not None:
                (audit.problem if complete and not allow_missing_frames else audit.warn)(
                    "frames",
                    f"step {step}: {bare.other} survivors of step {prev} ({bare.other_videos} videos that are not "
                    f"`k:`) were never screened, as {short}: fill it (`pool-frames`, `pool-fetch --frames`), then "
                    f"pool-enqueue --step {step}",
                )
        settled = pc.sum(pc.is_in(elig, value_set=store.settled(step))).as_py() or 0
        left = len(elig) - settled
        if left:
            (audit.problem if complete else audit.warn)(
                "incomplete",
                f"step {step}: {left} of {len(elig)} eligible items have no final row yet "
                f"(REMAINING_TOTAL={left}); pool-enqueue --step {step} queues them",
            )
    return audit


def _scan(audit: Audit, step: int, seg: Path, protocol: Protocol, advance: Callable[[int], None]) -> None:
    """Parse and validate every line of one segment, unlike the index, which skips what it cannot read. A line
    at a time: a segment of the full pool is ~400 MB, and the audit's memory stays flat at any size."""
    n_orders = protocol.steps[step].n_orders
    bad_orders: list[str] = []
    pos = shown = 0
    with seg.open("rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                audit.problem(
                    "torn line",
                    f"{seg}: {len(line)} bytes at offset {pos} without an end of line (a write cut short by a "
                    "crash, or refused by the disk and not yet cut back by its worker, which does so once writes "
                    f"work again; the row is not counted; with no worker left to cut it: truncate -s {pos} {seg})",
                )
                pos += len(line)
                break
            try:
                row = Row.model_validate(orjson.loads(line))
            except (orjson.JSONDecodeError, ValidationError) as e:
                audit.problem("unparsable row", f"{seg}: offset {pos}: {str(e).splitlines()[0][:200]}")
            else:
                audit.rows += 1
                audit.fingerprints[row.fingerprint] += 1
                if row.step != step:
                    audit.problem(
                        "wrong step", f"{seg}: offset {pos}: a step-{row.step} row in step{step}/", [row.item_id]
                    )
                if row.status == "ok" and not _orders_ok(row, protocol, step):
                    bad_orders.append(row.item_id)
            pos += len(line)
            if pos - shown > 1 << 22:
                advance(pos - shown)
                shown = pos
    advance(pos - shown)  # the bytes read: a segment still being written never shows over 100 %
    if bad_orders:
        audit.problem(
            f"step-{step} orders",
            f"{seg}: {len(bad_orders)} ok rows without the protocol's {n_orders} orders",
            bad_orders,
        )


def _orders_ok(row: Row, protocol: Protocol, step: int) -> bool:
    n_orders = protocol.steps[step].n_orders
    if row.n_perm != n_orders or len(row.forwards) != n_orders:
        return False
    n = len(row.forwards[0].order)
    return [f.order for f in row.forwards] == protocol.orders(step, row.item_id, n)


def _check_fingerprints(audit: Audit, root: Path, protocol: Protocol) -> None:
    stamp = root / STAMP
    theirs = orjson.loads(stamp.read_bytes()).get("fingerprint") if stamp.exists() else None
    if theirs is not None and theirs != protocol.fingerprint:
        audit.problem("protocol", f"{stamp} says {theirs}; auditing against {protocol.fingerprint} (--protocol-file?)")
    if len(audit.fingerprints) > 1 or (audit.fingerprints and protocol.fingerprint not in audit.fingerprints):
        counts = ", ".join(f"{fp}: {n} rows" for fp, n in audit.fingerprints.most_common())
        audit.problem("protocol", f"rows of more than one protocol or not of {protocol.fingerprint}: {counts}")


def _check_duplicates(audit: Audit, step: int, idx: pa.Table) -> None:
    ok = idx.filter(pc.equal(idx.column("status"), "ok"))
    if not ok.num_rows:
        return
    ok = ok.append_column("_rm", pc.cast(pc.fill_null(ok.column("removed"), False), pa.int8()))
    g = ok.group_by("item_id").aggregate([("item_id", "count"), ("_rm", "count_distinct"), ("pred", "count_distinct")])
    rep = g.filter(pc.greater(g.column("item_id_count"), 1))
    if not rep.num_rows:
        return
    split = pc.or_(pc.greater(rep.column("_rm_count_distinct"), 1), pc.greater(rep.column("pred_count_distinct"), 1))
    bad = pc.filter(rep.column("item_id"), split).to_pylist()
    same = pc.filter(rep.column("item_id"), pc.invert(split)).to_pylist()
    if bad:
        audit.problem(
            "duplicate winners",
            f"step {step}: {len(bad)} items have several ok rows that disagree "
            "(removed or pred); which one users read would be arbitrary",
            bad,
        )
    if same:
        audit.warn(
            "repeated rows",
            f"step {step}: {len(same)} items have several ok rows with the same verdict "
            "(work repeated after a crash or a lost lease); the earliest is read",
            same,
        )


def _lines(tag: str, found: list[Finding]) -> list[str]:
    out = []
    for f in found:
        ex = f" (e.g. {', '.join(f.examples)})" if f.examples else ""
        out.append(f"{tag} [{f.check}] {f.detail}{ex}")
    return out


def summary(audit: Audit) -> str:
    lines = _lines("PROBLEM", audit.problems) + _lines("warning", audit.warnings)
    verdict = f"{len(audit.problems)} problem(s)" if audit.problems else "OK"
    lines.append(
        f"audit: {audit.rows:,} rows in {audit.segments} segment(s): {verdict}, {len(audit.warnings)} warning(s)"
    )
    return "\n".join(lines)


def audit_results(settings: Settings, complete: bool = False) -> Audit:
    """The audit of the results root the settings name (exits with the reason when there is none)."""
    if not settings.results_dir.is_dir():
        what = "is a file, not a folder" if settings.results_dir.exists() else "does not exist"
        fail(f"results folder {settings.results_dir} ({settings.results_named()}) {what}")
    items = load_items(settings.items_dir, settings.root_named())
    return run_audit(settings.results_dir, load_protocol(settings), items, settings.frames_dir, complete=complete,
                     tar_dir=settings.frames_tar_dir, allow_missing_frames=settings.allow_missing_frames)  # fmt: skip
