"""pool-launch's derived batch and in-flight sizes (pool_queue.sizing): the rule, not a timing."""

from __future__ import annotations

import pytest

from pool_queue.protocol import Protocol
from pool_queue.sizing import GIB, KV_BYTES, OVERHEAD_GIB, WEIGHTS_GIB, prompt_tokens, size

P = Protocol()
TEXT, FRAMES = P.model_groups()  # (1, 2) on the 8B, (3,) on the 2B


def test_on_the_h200_each_group_gets_the_measured_best_batch_and_a_full_queue():
    text, frames = size(P, TEXT, 140.4, 0.85), size(P, FRAMES, 140.4, 0.85)
    assert (text.max_seqs, text.inflight, text.processes) == (256, 512, 4)  # 97 % busy at 256 and 4 x 128 (h200.md)
    assert (frames.max_seqs, frames.inflight, frames.processes) == (64, 64, 1)  # more only waits, costs prefix hits
    assert text.why.startswith("steps 1,2: MAX_SEQS 256, 512 in flight per server (2 x MAX_SEQS; 4 worker processes")
    assert text.per_process == 128 and size(P, TEXT, 31.7, 0.85).processes == 1


@pytest.mark.parametrize("gib", [15.0, 22.0, 31.7, 39.4, 47.5, 79.1, 140.4, 178.4])
def test_every_batch_fits_its_kv_cache_twice_so_no_start_up_runs_out_of_memory(gib):
    """The 32 GB guidance of the run package: the 8B gets 32 there, as it advises, step 3 fewer."""
    for group in (TEXT, FRAMES):
        sz = size(P, group, gib, 0.85)
        model = P.steps[group[0]].model
        kv = gib * 0.85 - WEIGHTS_GIB[model] - OVERHEAD_GIB
        need = sz.max_seqs * prompt_tokens(P, group) * KV_BYTES[model] / GIB
        assert sz.max_seqs >= 8 and (kv <= 0 or sz.max_seqs == 8 or 2 * need <= kv), (gib, group, sz)
    assert size(P, TEXT, 31.7, 0.85).max_seqs == 32 and size(P, FRAMES, 31.7, 0.85).max_seqs == 8


def test_the_users_settings_win_and_an_unknown_gpu_keeps_the_run_packages_value():
    assert size(P, TEXT, 140.4, 0.85, max_seqs=48).max_seqs == 48
    assert size(P, TEXT, 140.4, 0.85, max_seqs=48).inflight == 96  # in flight still follows the batch
    assert size(P, FRAMES, 140.4, 0.85, workers=100).inflight == 100
    assert "WORKERS as set" in size(P, FRAMES, 140.4, 0.85, workers=100).why
    unknown = size(P, TEXT, None, 0.85)
    assert (unknown.max_seqs, unknown.inflight) == (64, 128) and "GPU memory unknown" in unknown.why
