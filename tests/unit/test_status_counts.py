"""pool-status's item counts over crafted states: done, queued and running never overlap."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pool_queue.observe.status import split

IDS = [f"i{i}" for i in range(40)]
subsets = st.lists(st.sampled_from(IDS), max_size=60)  # repeats: an item in two jobs (a rescued job run twice)


@settings(max_examples=300, deadline=None)
@given(elig=st.lists(st.sampled_from(IDS), unique=True), settled=subsets, running=subsets, queued=subsets)
def test_done_queued_and_running_are_disjoint_parts_of_eligible(elig, settled, running, queued):
    def arr(xs: list[str]) -> pa.Array:
        return pa.array(xs, pa.string())

    done, q, r = split(arr(elig), arr(settled), arr(running), arr(queued))
    assert done + q + r <= len(elig)
    e = set(elig)
    assert done == len(e & set(settled))
    assert r == len((e & set(running)) - set(settled))
    assert q == len((e & set(queued)) - set(settled) - set(running))


def test_a_rerun_job_whose_items_have_rows_counts_only_what_is_left():
    """The snapshot the issue saw: done 243 + queued 57 + running 411 > 625 eligible."""
    elig = pa.array([f"i{i}" for i in range(625)], pa.string())
    settled = elig.slice(0, 243)
    running = elig.slice(200, 411)  # jobs re-run after a rescue: 43 of their items already have rows
    queued = pa.concat_arrays([elig.slice(580, 45), elig.slice(600, 12)])  # overlapping and running items
    done, q, r = split(elig, settled, running, queued)
    assert (done, r, q) == (243, 368, 14) and done + q + r <= 625
