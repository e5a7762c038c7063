"""pool-launch's derived batch and in-flight sizes (pool_queue.launch.sizing): the rule, not a timing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pool_queue.errors import SetupError
from pool_queue.launch.sizing import GIB, KV_BYTES, OVERHEAD_GIB, WEIGHTS_GIB, coserve, prompt_tokens, size
from pool_queue.protocol import Protocol
from pool_queue.settings import load_settings

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


def test_one_gpu_serves_both_models_at_once_only_where_both_get_their_best_batch():
    """`coserve`: step 3's batch once over (one batch in flight, siblings share frames), the rest holds the
    8B's twice over as alone; where that fails (a 32 GB card, an 80 GB one) the models take turns."""
    for gib in (140.4, 178.4):
        shares = coserve(P, gib, 0.85)
        assert shares is not None and sum(shares.values()) <= 0.85 + 1e-9, gib
        frames = size(P, FRAMES, gib, shares[FRAMES], copies=1)
        assert size(P, TEXT, gib, shares[TEXT]).max_seqs == 256 and frames.max_seqs == 64
        kv = gib * shares[FRAMES] - WEIGHTS_GIB[P.steps[3].model] - OVERHEAD_GIB
        assert 64 * prompt_tokens(P, FRAMES) * KV_BYTES[P.steps[3].model] / GIB <= kv  # the batch fits once
    assert coserve(P, 140.4, 0.85) == {TEXT: 0.45, FRAMES: 0.4}
    assert coserve(P, 79.1, 0.85) is None and coserve(P, 31.7, 0.85) is None and coserve(P, None, 0.85) is None
    assert coserve(P, 140.4, 0.6) is None  # a lowered GPU_UTIL leaves the 8B too little: one after the other


@pytest.mark.parametrize(
    ("gib", "util", "refused", "warned"),
    [
        (16.0, 0.85, [TEXT], [FRAMES]),
        (24.0, 0.85, [TEXT], []),  # 0.0 GiB left beside the 8B's 16.4 GiB of weights
        (24.0, 0.95, [], []),  # 2.4 GiB: 33 prompts of steps 1-2, a batch of 16
        (22.0, 0.85, [TEXT], [FRAMES]),
        (31.7, 0.85, [], []),  # a 32 GB card: the run package's 32 for the 8B, 8 for step 3
        (32.0, 0.85, [], []),
        (140.4, 0.85, [], []),
    ],
)
def test_a_gpu_that_cannot_hold_the_model_is_refused_and_one_with_a_small_kv_cache_is_warned_about(
    gib, util, refused, warned
):
    for group in (TEXT, FRAMES):
        sz = size(P, group, gib, util)
        model = P.steps[group[0]].model
        assert (sz.refusal is not None, sz.warning is not None) == (group in refused, group in warned), (group, sz)
        for line in filter(None, (sz.refusal, sz.warning)):
            assert f"the GPU's {gib:.1f} GiB at GPU_UTIL {util:g}" in line and f"{WEIGHTS_GIB[model]:.1f} GiB" in line
            assert f"leaving {max(0.0, gib * util - WEIGHTS_GIB[model] - OVERHEAD_GIB):.1f} GiB of KV cache" in line
    assert size(P, TEXT, None, 0.85).refusal is None  # memory unknown: nothing to judge by
    assert size(P, TEXT, 24.0, 0.85, max_seqs=8).refusal is not None  # a smaller batch does not make room


def test_max_seqs_per_step_sizes_the_server_of_those_steps_and_derives_the_others(monkeypatch):
    """`MAX_SEQS=3:64`: step 3's server batches 64 with 64 in flight (on an H100, where the rule derives 32), the
    8B keeps its derived 256; a bare number is still one for every server."""
    monkeypatch.setenv("POOL_ENV_FILE", "")
    monkeypatch.setenv("MAX_SEQS", "3:64")
    settings = load_settings()
    assert settings.max_seqs == {3: 64} and settings.max_seqs_for(FRAMES) == 64 and settings.max_seqs_for(TEXT) is None
    frames, text = (size(P, g, 79.1, 0.85, settings.max_seqs_for(g)) for g in (FRAMES, TEXT))
    assert (frames.max_seqs, frames.inflight) == (64, 64) and frames.why.endswith("MAX_SEQS as set")
    assert size(P, FRAMES, 79.1, 0.85).max_seqs == 32 and text.max_seqs == 256 and "MAX_SEQS as set" not in text.why
    monkeypatch.setenv("MAX_SEQS", " 1:256, 3:48 ")
    assert load_settings().max_seqs == {1: 256, 3: 48}
    monkeypatch.setenv("MAX_SEQS", "64")
    assert [load_settings().max_seqs_for(g) for g in (TEXT, FRAMES)] == [64, 64]
    monkeypatch.setenv("MAX_SEQS", "1:256,2:128")  # one server serves steps 1 and 2: one batch
    with pytest.raises(SetupError, match=r"MAX_SEQS gives steps 1,2, which one server serves, different batches"):
        load_settings().max_seqs_for(TEXT)
    for bad in ("3:0", "x:4", "3:", "3:abc", "0:8", "-1", "3:64,3:32", "\u00b2:64"):
        monkeypatch.setenv("MAX_SEQS", bad)
        with pytest.raises(ValidationError):
            load_settings()
