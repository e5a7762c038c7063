"""What a step still needs: eligible(N) per protocol v1, minus what the store already settled,
minus what Redis already holds. All set operations are pyarrow column operations."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from .frames import frame_videos
from .store import Store

MAX_ITEM_RUNS = 3  # a later run re-attempts transient error rows until an item has this many


def survivors(store: Store, step: int) -> pa.Array:
    """Items whose step-`step` row is ok and not removed."""
    w = store.winners(step)
    keep = pc.and_(pc.equal(w.column("status"), "ok"), pc.invert(pc.fill_null(w.column("removed"), True)))
    return pc.filter(w.column("item_id"), keep).combine_chunks()


def eligible(step: int, items: pa.Table, store: Store, frames_dir: Path) -> pa.Table:
    """Step 1: every valid item; step 2: step-1 survivors with frames; step 3: step-2 survivors."""
    cols = items.select(["item_id", "benchmark", "video_id"])
    if step == 1:
        return cols
    alive = pc.is_in(cols.column("item_id"), value_set=survivors(store, step - 1))
    if step == 2:
        alive = pc.and_(alive, pc.is_in(cols.column("video_id"), value_set=frame_videos(frames_dir)))
    return cols.filter(alive)


@dataclass(frozen=True)
class Plan:
    step: int
    eligible: pa.Table
    settled: int  # eligible items the store needs nothing more for
    pending: int  # eligible items already queued or running
    remaining: pa.Table  # to enqueue now

    def by_benchmark(self) -> list[tuple[str, int, int]]:
        """(benchmark, eligible, remaining) rows, sorted by benchmark."""

        def counts(t: pa.Table) -> dict[str, int]:
            g = t.group_by("benchmark").aggregate([("item_id", "count")])
            return dict(zip(g.column("benchmark").to_pylist(), g.column("item_id_count").to_pylist(), strict=True))

        e, r = counts(self.eligible), counts(self.remaining)
        return [(b, e[b], r.get(b, 0)) for b in sorted(e)]


def make_plan(step: int, items: pa.Table, store: Store, frames_dir: Path, pending_ids: list[str]) -> Plan:
    elig = eligible(step, items, store, frames_dir)
    ids = elig.column("item_id")
    settled = pc.is_in(ids, value_set=store.final_ids(step, MAX_ITEM_RUNS))
    pending = pc.and_(pc.invert(settled), pc.is_in(ids, value_set=pa.array(pending_ids, pa.string())))
    todo = pc.invert(pc.or_(settled, pending))
    # by video at every step: step 1's chunks then hold whole videos, so do the follow-ups they chain to
    remaining = elig.filter(todo).sort_by([("video_id", "ascending"), ("item_id", "ascending")])
    return Plan(step, elig, pc.sum(settled).as_py() or 0, pc.sum(pending).as_py() or 0, remaining)
