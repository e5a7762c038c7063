"""What a job's rows mean for the store and the next step: items already settled, and the follow-up."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pool_queue.inputs.frames import video_folder
from pool_queue.jobs.plan import next_step_ids
from pool_queue.protocol import Protocol
from pool_queue.rows import Row
from pool_queue.store.store import Store


def already_final(store: Store, step: int, ids: list[str]) -> set[str]:
    """The job's items that need no more work (a re-delivered job, or one queued beside running workers)."""
    return set(store.settled(step, among=pa.array(ids, pa.string())).to_pylist())


def follow_up(
    protocol: Protocol,
    store: Store,
    frames_dir: Path,
    videos_of: Callable[[list[str]], dict[str, str]],
    step: int,
    rows: list[Row],
    skipped: set[str],
) -> list[str]:
    """The next step's items from this job, by the planner's chain rule (`plan.next_step_ids`): of its
    new rows, and of the stored rows of items a re-delivered job skipped (their chain may not have
    been sent). `videos_of` maps item ids to their videos (ids it does not know are left out)."""
    nxt = protocol.next_step(step)
    if nxt is None:
        return []
    fresh = pa.table(
        {
            "item_id": pa.array([r.item_id for r in rows], pa.string()),
            "status": pa.array([r.status for r in rows], pa.string()),
            "removed": pa.array([r.removed for r in rows], pa.bool_()),
            "video_id": pa.array([r.video_id for r in rows], pa.string()),
        }
    )
    if skipped:
        w = store.winners(step, among=pa.array(sorted(skipped), pa.string())).select(["item_id", "status", "removed"])
        videos = videos_of(w.column("item_id").to_pylist())
        known = w.filter(pc.is_in(w.column("item_id"), value_set=pa.array(list(videos), pa.string())))
        vids = pa.array([videos[i] for i in known.column("item_id").to_pylist()], pa.string())
        fresh = pa.concat_tables([fresh, known.append_column("video_id", vids)])
    with_frames: list[str] = []
    if protocol.steps[nxt].frames != "none":  # the planner's frame rule, exactly (one stat per video)
        with_frames = [v for v in set(fresh.column("video_id").to_pylist()) if video_folder(frames_dir, v)[0]]
    return next_step_ids(protocol, step, fresh, pa.array(with_frames, pa.string()))
