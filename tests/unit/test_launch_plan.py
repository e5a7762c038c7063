"""Step 3's server arguments as pool-launch plans them, for each vLLM release and GPU size it knows: the prefill
budget (`--max-num-batched-tokens`) with and without MAX_BATCHED_TOKENS=derived, and its memory within the
GPU's. Planning only: no process is started."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from pool_queue.launch.plan import Server
from pool_queue.launch.sizing import (
    GIB,
    KV_BYTES,
    OVERHEAD_GIB,
    WEIGHTS_GIB,
    Sizing,
    activation_gib,
    frame_tokens,
    prompt_tokens,
    size,
    step_budget,
)
from pool_queue.launch.vllm import (
    BATCHED_TOKENS,
    BATCHED_TOKENS_MANY_IMAGES,
    Tuning,
    batched_tokens,
    flags_of_release,
    served_frame,
    server_argv,
    steps_held,
)
from pool_queue.protocol import Protocol
from pool_queue.settings import Settings, load_settings

P = Protocol()
STEP3, TEXT = (3,), (1, 2)
RELEASES = ("0.11.0", "0.26.0", "0.32.0")  # the run package's pin, the measured one, the newest read
# GPUs as nvidia-smi gives their memory (GiB): a 32 GB card, A100 40 GB, L40S, H100, H200, B200.
GPUS = {"32 GB": 31.7, "A100-40": 39.4, "L40S": 47.5, "H100": 79.1, "H200": 140.4, "B200": 178.4}
# MAX_BATCHED_TOKENS=derived on a release that holds two steps' encoder outputs, square 448-px frames:
# 5 videos x 6,272 tokens x 2 = 62,720 -> 65,536 where its activations fit beside the batch's KV cache.
DERIVED_TWO_STEPS = {"32 GB": 65536, "A100-40": 32768, "L40S": 65536, "H100": 65536, "H200": 65536, "B200": 65536}


def settings(root: Path, budget: str | None) -> Settings:
    return load_settings(root=root, **({"max_batched_tokens": budget} if budget else {}))


def argv_of(settings: Settings, release: str, gib: float) -> tuple[list[str], Sizing]:
    """Step 3's `vllm serve` arguments on one GPU of `gib`, as pool-launch builds them for `release`."""
    sized = size(P, STEP3, gib, settings.gpu_util)
    budget = batched_tokens(settings, P, STEP3, sized, release)
    tuning = Tuning.for_cores(16, release=release, cache_gb=0.4)
    srv, known = Server(0, "0", STEP3, 8001), flags_of_release(release)
    return server_argv(settings, P, srv, "/snap", False, tuning, known, sized.max_seqs, budget.tokens), sized


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def write_frames(frames_dir: Path, sizes: dict[str, tuple[int, int]]) -> None:
    """One video folder per size, two frames each (only the first is read)."""
    for video, wh in sizes.items():
        (frames_dir / video).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", wh).save(frames_dir / video / f"frame_{i}.jpg")


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("release", RELEASES)
def test_step3s_arguments_for_each_release_and_gpu_with_and_without_the_derived_budget(tmp_path, release, gpu):
    """Without the option every release and GPU keeps 32,768; with it a release that holds two steps' encoder
    outputs gets 65,536 where the activations fit the KV cache room the batch leaves (not on a 40 GB card),
    0.11.0 (one step) keeps 32,768. The rest of the arguments do not change with the option."""
    gib = GPUS[gpu]
    plain, sized = argv_of(settings(tmp_path, None), release, gib)
    derived, _ = argv_of(settings(tmp_path, "derived"), release, gib)
    assert flag(plain, "--max-num-batched-tokens") == str(BATCHED_TOKENS_MANY_IMAGES)
    want = DERIVED_TWO_STEPS[gpu] if release != "0.11.0" else BATCHED_TOKENS_MANY_IMAGES
    assert flag(derived, "--max-num-batched-tokens") == str(want)
    i = plain.index("--max-num-batched-tokens")
    assert derived[:i] + derived[i + 2 :] == plain[:i] + plain[i + 2 :]
    assert flag(derived, "--max-num-seqs") == str(sized.max_seqs)
    assert ("--renderer-num-workers" in derived) == (release != "0.11.0")  # flags the release knows, as before
    # the budget's memory within the GPU's: weights, overhead, the batch's prompts twice in KV, the activations
    # the budget adds over the default
    model = P.steps[3].model
    kv = 2 * sized.max_seqs * prompt_tokens(P, STEP3) * KV_BYTES[model] / GIB
    used = WEIGHTS_GIB[model] + OVERHEAD_GIB + kv + activation_gib(want - BATCHED_TOKENS_MANY_IMAGES)
    assert used <= gib * 0.85, (gpu, release, used)


def test_a_budget_too_large_for_the_gpu_is_lowered_to_the_largest_power_of_two_that_fits():
    """48 frames on a release that holds two steps: 5 x 9,408 x 2 = 94,080 -> 131,072 (12 GiB more than
    32,768); 5 GiB of room take 65,536 (4 GiB), 1 GiB none above the default, an unknown GPU none."""
    room = {gib: Sizing(64, 64, 1, "", spare_gib=gib) for gib in (20.0, 5.0, 1.0)}
    assert step_budget(48 * 196, 2, 32768, room[20.0])[0] == 131072
    tokens, why = step_budget(48 * 196, 2, 32768, room[5.0])
    assert tokens == 65536 and "gives 131,072, lowered so that 4.0 GiB of activations over 32,768's fit" in why
    tokens, why = step_budget(48 * 196, 2, 32768, room[1.0])
    assert tokens == 32768 and "would not fit the 1.0 GiB of KV cache the batch leaves: the default 32,768" in why
    tokens, why = step_budget(48 * 196, 2, 32768, Sizing(64, 64, 1, ""))
    assert tokens == 32768 and "the GPU's memory is unknown" in why
    assert step_budget(4 * 196, 2, 32768, room[1.0])[0] == 8192  # few frames: less, never below one prompt


def test_the_frame_size_served_decides_the_tokens_per_video(tmp_path):
    """Qwen3-VL gives 196 tokens for a 448x448 frame, 112 for 448x252 and 140 for 448x336 (4:3, between):
    the budget follows the pool's frames (the one of most tokens among them), else the protocol's square."""
    assert (frame_tokens(448, 448), frame_tokens(448, 252), frame_tokens(448, 336)) == (196, 112, 140)
    wide, mixed = tmp_path / "wide", tmp_path / "mixed"
    write_frames(wide / "frames" / "pool_frames", {"a": (1920, 1080), "b": (640, 360)})  # both served 448x252
    write_frames(mixed / "frames" / "pool_frames", {"a": (854, 480), "b": (448, 336), "c": (336, 448)})
    none = served_frame(settings(tmp_path / "empty", None), P)
    assert (none.width, none.height, none.tokens, none.source) == (448, 448, 196, "the protocol's largest")
    assert served_frame(settings(wide, None), P).tokens == 112
    assert served_frame(settings(mixed, None), P).tokens == 140  # 4:3 over 16:9
    h100 = size(P, STEP3, GPUS["H100"], 0.85)
    lines = {}
    for root, tokens in ((tmp_path / "empty", 196), (wide, 112), (mixed, 140)):
        for release in ("0.11.0", "0.26.0"):
            b = batched_tokens(settings(root, "derived"), P, STEP3, h100, release)
            per_video = 32 * tokens
            assert f"32 frames x {tokens} tokens" in b.why and f"= {per_video:,} per video" in b.why, b.why
            held = steps_held(release)
            assert f"5 videos {'twice over' if held == 2 else 'once'} = {5 * held * per_video:,}" in b.why
            lines[root.name, release] = b.tokens
    assert lines == {
        ("empty", "0.11.0"): 32768, ("empty", "0.26.0"): 65536,  # 31,360 / 62,720
        ("wide", "0.11.0"): 32768, ("wide", "0.26.0"): 65536,  # 17,920 / 35,840
        ("mixed", "0.11.0"): 32768, ("mixed", "0.26.0"): 65536,  # 22,400 / 44,800
    }  # fmt: skip
    line = batched_tokens(settings(wide, "derived"), P, STEP3, h100, "0.26.0").why
    assert line.startswith("step 3: --max-num-batched-tokens 65,536 (MAX_BATCHED_TOKENS=derived)")
    assert "(448x252, the pool's frames: the largest of 2 videos' first)" in line
    assert "vLLM 0.26.0 holds encoder outputs for two steps in flight" in line


def test_which_releases_hold_two_steps_of_encoder_outputs():
    """0.11.0 frees a request's encoder inputs once scheduled and runs one step at a time; 0.26.0 and 0.32.0
    run async scheduling by default and free outputs after the step ran; an unknown release as the newer."""
    assert [steps_held(r) for r in ("0.11.0", "0.11.2", "0.26.0", "0.32.0+cpu", None)] == [1, 1, 2, 2, 2]


def test_the_users_budget_wins_for_every_server_and_without_the_option_the_default_stays(tmp_path):
    sized = {g: size(P, g, GPUS["H200"], 0.85) for g in (TEXT, STEP3)}
    own = settings(tmp_path, "49152")
    for g in (TEXT, STEP3):
        b = batched_tokens(own, P, g, sized[g], "0.26.0")
        label = "step 3" if g == STEP3 else "steps 1,2"
        assert (b.tokens, b.why) == (49152, f"{label}: --max-num-batched-tokens 49,152: MAX_BATCHED_TOKENS as set")
    plain = batched_tokens(settings(tmp_path, None), P, STEP3, sized[STEP3], "0.26.0")
    assert plain.tokens == 32768 and plain.why.endswith("32,768: the default; MAX_BATCHED_TOKENS=derived sizes it "
                                                        "from the frames")  # fmt: skip
    text = batched_tokens(settings(tmp_path, "derived"), P, TEXT, sized[TEXT], "0.26.0")
    assert (text.tokens, text.why) == (BATCHED_TOKENS, "steps 1,2: --max-num-batched-tokens 16,384: the default")


@pytest.mark.parametrize("bad", ["abc", "0", "-5", "1.5", "derive"])
def test_a_budget_that_is_neither_tokens_nor_derived_is_refused(bad, monkeypatch):
    monkeypatch.setenv("MAX_BATCHED_TOKENS", bad)
    with pytest.raises(ValueError, match=f"{bad!r} is neither a number of tokens above 0 nor derived"):
        load_settings()


def test_max_seqs_for_step_3_alone_reaches_its_server_and_no_other(tmp_path, monkeypatch):
    monkeypatch.setenv("MAX_SEQS", "3:64")
    s = load_settings(root=tmp_path)
    argv, sized = argv_of(s, "0.26.0", GPUS["H100"])
    assert flag(argv, "--max-num-seqs") == "64" and sized.max_seqs == 32  # the rule alone would give 32
    text = server_argv(s, P, Server(0, "0", TEXT, 8001), "/snap", False, None, None, 256)
    assert flag(text, "--max-num-seqs") == "256"  # the 8B's derived batch
