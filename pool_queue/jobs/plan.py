"""What a step still needs: eligible(N) per the protocol, minus what the store already settled, minus
what Redis already holds; and the one chain rule (`next_step_ids`) that both the plan and a worker's
follow-up job use. All set operations are pyarrow column operations."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from ..inputs.frames import frame_videos
from ..inputs.shards import MANIFEST, read_manifest, video_folder_count
from ..protocol import Protocol
from ..store.store import Store


def _alive(rows: pa.Table) -> pa.Array:
    """Rows (status, removed) that pass an item on: ok and not removed."""
    return pc.and_(pc.equal(rows.column("status"), "ok"), pc.invert(pc.fill_null(rows.column("removed"), True)))


def next_step_ids(protocol: Protocol, step: int, rows: pa.Table, with_frames: pa.Array) -> list[str]:
    """The chain rule: items of `rows` (item_id, video_id, status, removed: one per item) that go on from
    `step`: ok, not removed, and, when the next step sends frames, of a video in `with_frames`. In video
    order, so the next step's chunks hold whole videos."""
    nxt = protocol.next_step(step)
    if nxt is None or not rows.num_rows:
        return []
    keep = _alive(rows)
    if protocol.steps[nxt].frames != "none":
        keep = pc.and_(keep, pc.is_in(rows.column("video_id"), value_set=with_frames))
    go = rows.filter(keep).sort_by([("video_id", "ascending"), ("item_id", "ascending")])
    ids: list[str] = go.column("item_id").to_pylist()
    return ids


def eligible(protocol: Protocol, step: int, items: pa.Table, store: Store, frames_dir: Path) -> pa.Table:
    """The first step: every valid item; a later one: what the chain rule passes on from the one before."""
    cols = items.select(["item_id", "benchmark", "video_id"])
    prev = protocol.prev_step(step)
    if prev is None:
        return cols
    rows = store.winners(prev).select(["item_id", "status", "removed"]).join(cols, "item_id", join_type="inner")
    ids = next_step_ids(protocol, prev, rows, frame_videos(frames_dir))
    return cols.filter(pc.is_in(cols.column("item_id"), value_set=pa.array(ids, pa.string())))


@dataclass(frozen=True)
class Frameless:
    """Items whose video has no frame folder, in the run package's two kinds: `k:` videos are not downloaded
    in this snapshot (by design: 116,170 items of the real pool), every other video's folder belongs in the
    cache, so one missing is a cache short of what the screen needs."""

    k: int = 0  # items of `k:` videos
    other: int = 0  # items of any other video
    other_videos: int = 0  # the distinct videos of those

    @property
    def total(self) -> int:
        return self.k + self.other


def count_frameless(rows: pa.Table, frames_dir: Path) -> Frameless:
    """The one count of items without frames (`rows`: item_id, video_id), for status, the report, the demo,
    the audit and the frames check before steps with frames are enqueued."""
    bare = rows.filter(pc.invert(pc.is_in(rows.column("video_id"), value_set=frame_videos(frames_dir))))
    videos = bare.column("video_id")
    other = pc.filter(videos, pc.invert(pc.starts_with(videos, "k:")))
    return Frameless(len(videos) - len(other), len(other), len(pc.unique(other)))


def frameless(protocol: Protocol, step: int, items: pa.Table, store: Store, frames_dir: Path) -> Frameless:
    """Survivors of the step before `step` that the chain rule holds back only because their video has no
    frame folder (`k:` videos, not downloaded in this snapshot, and folders absent): never screened at
    `step` or after it here (one settled there had its frames then). Zeros when `step` sends no frames or is
    the first."""
    prev = protocol.prev_step(step)
    if prev is None or protocol.steps[step].frames == "none":
        return Frameless()
    cols = items.select(["item_id", "video_id"])
    rows = store.winners(prev).select(["item_id", "status", "removed"]).join(cols, "item_id", join_type="inner")
    rows = rows.filter(pc.and_(pc.fill_null(_alive(rows), False),
                               pc.invert(pc.is_in(rows.column("item_id"), value_set=store.settled(step)))))  # fmt: skip
    return count_frameless(rows, frames_dir)


def cache_shortfall(frames_dir: Path, tar_dir: Path | None) -> str | None:
    """What is wrong with the frame cache as a whole, or None: absent, empty, or fewer video folders than the
    manifest of its shards (`n_videos`) says it holds. Videos that are not `k:` and have no folder in a cache
    that is whole per its manifest are not in this snapshot (the run package allows for them); without a
    manifest (shards deleted, or not mounted) only an absent or empty cache can be told apart."""
    if not frames_dir.is_dir():
        return f"the frame cache {frames_dir} does not exist"
    try:
        have = video_folder_count(frames_dir)
    except OSError as e:
        return f"the frame cache {frames_dir} cannot be read ({e.strerror or e})"
    if not have:
        return f"the frame cache {frames_dir} holds no video folder"
    if tar_dir is not None and (tar_dir / MANIFEST).is_file() and have < (n := read_manifest(tar_dir).n_videos):
        return f"the frame cache {frames_dir} holds {have:,} video folders, n_videos of {tar_dir / MANIFEST} is {n:,}"
    return None


def _on_the_way(protocol: Protocol, step: int, items: pa.Table, store: Store) -> pa.Array:
    """Items still on their way to `step` and not settled there: no step before it settled them without
    passing them on. Before any screen, every item; once the steps before are complete, `step`'s survivors
    it has still to screen."""
    ids = items.column("item_id")
    keep = pc.invert(pc.is_in(ids, value_set=store.settled(step)))
    before = protocol.prev_step(step)
    while before is not None:
        w = store.winners(before)
        out = pc.filter(w.column("item_id"), pc.invert(pc.fill_null(_alive(w), False)))
        out = pc.filter(out, pc.is_in(out, value_set=store.settled(before)))
        keep = pc.and_(keep, pc.invert(pc.is_in(ids, value_set=out)))
        before = protocol.prev_step(before)
    return keep


def frames_refusal(
    protocol: Protocol, steps: list[int], items: pa.Table, store: Store, frames_dir: Path, tar_dir: Path
) -> str | None:
    """Why `steps` must not be screened with the frame cache as it stands, or None: items that a step of them
    sending frames has still to screen whose video is not `k:` and has no folder, while the cache is absent,
    empty or short of its manifest (`cache_shortfall`). A video without frames leaves the chain at that step,
    so the screen would read complete with those items never screened."""
    framed = [s for s in steps if protocol.steps[s].frames != "none"]
    if not framed:
        return None
    cols = items.select(["item_id", "video_id"])
    need = functools.reduce(pc.or_, [_on_the_way(protocol, s, cols, store) for s in framed])
    bare = count_frameless(cols.filter(need), frames_dir)
    first = min(framed)
    if not bare.other or (why := cache_shortfall(frames_dir, tar_dir)) is None:
        return None
    last = max(protocol.steps)
    span = f"steps {first}-{last}" if last != first else f"step {first}"
    n, videos = f"{bare.other:,}", f"{bare.other_videos:,}"
    return f"{why}: {n} items of {videos} videos that are not `k:` would never be screened in {span}"


def frameless_note(bare: Frameless, before: int, first: int, last: int) -> str:
    """The line that accounts for `frameless` items, e.g. "343 survivors of step 1 have no frames: not
    screened in steps 2-3 here (300 of `k:` videos, ...; 43 of other videos, ...)", so that step 1's
    survivors and step 2's eligible items reconcile, and a cache short of its folders shows apart from the
    `k:` videos that have none by design."""
    steps = f"steps {first}-{last}" if last != first else f"step {first}"
    kinds = [f"{bare.k:,} of `k:` videos, not downloaded in this snapshot"] if bare.k else []
    kinds += [f"{bare.other:,} of other videos, whose folder is missing from frames/pool_frames"] if bare.other else []
    why = "; ".join(kinds)
    return f"{bare.total:,} survivors of step {before} have no frames: not screened in {steps} here ({why})"


def frameless_notes(protocol: Protocol, items: pa.Table, store: Store, frames_dir: Path) -> list[str]:
    """`frameless_note` for each step with such items, in step order (the demo's summary, the report)."""
    counts = {s: frameless(protocol, s, items, store, frames_dir) for s in sorted(protocol.steps)}
    return [frameless_note(n, protocol.prev_step(s) or 0, s, max(protocol.steps)) for s, n in counts.items() if n.total]


def reachable(protocol: Protocol, step: int, items: pa.Table, store: Store, frames_dir: Path) -> pa.Array:
    """Items eligible for `step`, plus those that may still become so: items not yet settled at an
    earlier step they reach (that have frames, where the step needs them). An upper bound, as the run
    package's "upper bound 183,196" for step 2; it equals eligible once the steps before are complete."""
    cols = items.select(["item_id", "video_id"])
    cur = cols.column("item_id").combine_chunks()
    with_frames: pa.Array | None = None
    prev, chain = protocol.prev_step(step), [step]
    while prev is not None:
        chain.insert(0, prev)
        prev = protocol.prev_step(prev)
    ids = cols.column("item_id")
    for before, after in itertools.pairwise(chain):
        open_ = pc.and_(pc.is_in(ids, value_set=cur), pc.invert(pc.is_in(ids, value_set=store.settled(before))))
        unsettled = cols.filter(open_)
        if protocol.steps[after].frames != "none":
            with_frames = frame_videos(frames_dir) if with_frames is None else with_frames
            unsettled = unsettled.filter(pc.is_in(unsettled.column("video_id"), value_set=with_frames))
        passed = eligible(protocol, after, items, store, frames_dir).column("item_id").combine_chunks()
        cur = pc.unique(pa.concat_arrays([passed, unsettled.column("item_id").combine_chunks()]))
    return cur


@dataclass(frozen=True)
class Plan:
    step: int
    eligible: pa.Table
    settled: int  # eligible items the store needs nothing more for
    pending: int  # eligible items already queued or running
    remaining: pa.Table  # to enqueue now
    upper: int  # eligible items plus those that may still become so (`reachable`)
    before: int | None  # the step whose survivors this one screens

    @property
    def remaining_total(self) -> int:
        """The run package's REMAINING_TOTAL: 0 only when the step is truly complete (its eligible items
        settled, and none can still come from an earlier step)."""
        return int(self.upper - self.settled)

    @property
    def waits_on(self) -> int:
        """Items that may still become eligible once the earlier steps finish."""
        return int(self.upper - self.eligible.num_rows)

    def by_benchmark(self) -> list[tuple[str, int, int]]:
        """(benchmark, eligible, remaining) rows, sorted by benchmark."""

        def counts(t: pa.Table) -> dict[str, int]:
            g = t.group_by("benchmark").aggregate([("item_id", "count")])
            return dict(zip(g.column("benchmark").to_pylist(), g.column("item_id_count").to_pylist(), strict=True))

        e, r = counts(self.eligible), counts(self.remaining)
        return [(b, e[b], r.get(b, 0)) for b in sorted(e)]


def make_plan(
    protocol: Protocol, step: int, items: pa.Table, store: Store, frames_dir: Path, pending_ids: list[str]
) -> Plan:
    elig = eligible(protocol, step, items, store, frames_dir)
    ids = elig.column("item_id")
    settled = pc.is_in(ids, value_set=store.settled(step))
    pending = pc.and_(pc.invert(settled), pc.is_in(ids, value_set=pa.array(pending_ids, pa.string())))
    todo = pc.invert(pc.or_(settled, pending))
    # by video at every step: step 1's chunks then hold whole videos, so do the follow-ups they chain to
    remaining = elig.filter(todo).sort_by([("video_id", "ascending"), ("item_id", "ascending")])
    upper = len(reachable(protocol, step, items, store, frames_dir))
    n_settled, n_pending = pc.sum(settled).as_py() or 0, pc.sum(pending).as_py() or 0
    return Plan(step, elig, n_settled, n_pending, remaining, upper, protocol.prev_step(step))
