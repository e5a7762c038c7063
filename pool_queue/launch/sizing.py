"""How many sequences a server batches (`--max-num-seqs`) and a worker keeps in flight, per model group,
from the GPU's memory and the group's prompts, as pool-launch's defaults.

The run package fixed MAX_SEQS at 64 for every step; on the H200 that left the GPU 44 % busy in
steps 1-2, where 256 sequences and 512 requests in flight reached 97 % (h200.md). Step 3's prompts
are ~20 times longer and there 64 was the best measured batch: more only queued inside the server
and cost prefix-cache hits. So each group gets the measured best batch (`CAP`), lowered to what its
KV cache holds twice over on a smaller GPU (a 32 GB card gets 32 for the 8B, as the run package
advises there, and fewer for step 3's long prompts, so no start-up runs out of memory). A worker keeps
twice the batch in flight for short prompts (the server always has queued work) and one batch for long
ones, spread over worker processes of at most `PER_PROCESS` each: in pool-launch on an H200, one process
of 512 kept steps 1-2 76 % busy, four of 128 84 % (h200.md, 2026-12-04). MAX_SEQS and WORKERS set by
the user win.

A GPU too small for the model is named before anything starts: a KV cache that cannot hold one sequence of
MAX_MODEL_LEN tokens is refused (vLLM would not start), one that holds fewer than MIN_SEQS prompts twice
over is warned about (the screen runs, at a small fraction of its speed).
"""

from __future__ import annotations

import math
import shutil
import subprocess
from dataclasses import dataclass

from ..protocol import Protocol
from ..text import steps_label

GIB = 1024**3
# Per token of KV cache (layers x KV heads x head dim x K and V x bf16) and bf16 weights, from the
# models' configs; an unknown model is sized as the larger one.
KV_BYTES = {"Qwen/Qwen3-VL-8B-Instruct": 36 * 8 * 128 * 2 * 2, "Qwen/Qwen3-VL-2B-Instruct": 28 * 8 * 128 * 2 * 2}
WEIGHTS_GIB = {"Qwen/Qwen3-VL-8B-Instruct": 16.4, "Qwen/Qwen3-VL-2B-Instruct": 4.4}
OVERHEAD_GIB = 4.0  # activations, CUDA graphs and the vision encoder's cache beside weights and KV
TEXT_TOKENS = 330  # step 2's question + options + the prefilled answer (step 1's is ~210)
FRAME_TOKENS = 196  # one 448 x 448 frame after Qwen3-VL's 2 x 2 merge (a 448 x 252 one is 112): `frame_tokens`
CAP = {"few images": 256, "many images": 64}  # the best measured on the H200 (h200.md)
FALLBACK_SEQS = 64  # the run package's value, when the GPU's memory cannot be read
MIN_SEQS = 8  # the smallest batch a server is given
MAX_MODEL_LEN = 8192  # step 3: 32 x 196 tokens for square 448-px frames, + text
HIGH_UTIL = 0.95  # the GPU_UTIL a refusal may suggest: vLLM's own default is 0.9
PER_PROCESS = 128  # forwards in flight per worker process for short prompts (one event loop's share)
# The prefill budget per engine step (`--max-num-batched-tokens`) sized from the frames (`step_budget`).
VIDEOS_PER_STEP = 5  # new videos whose encoder outputs one step holds: 65,536 is 5 square 32-frame videos twice
# GPU memory per budgeted token beyond the default budget, an upper estimate from the 2B's config: the vision
# tower's MLP over the token's four patches, the language model's MLP, and the encoder cache's embedding with
# its deepstack levels (~128 KiB; 32,768 tokens: the ~4 GiB of OVERHEAD_GIB).
ACTIVATION_BYTES_PER_TOKEN = 128 * 1024


@dataclass(frozen=True)
class Sizing:
    max_seqs: int
    inflight: int  # per server, over its worker processes
    processes: int  # worker processes per server
    why: str  # one line: what was chosen and from what
    warning: str | None = None  # the model fits, with room for only a small batch
    refusal: str | None = None  # the model does not fit with one full-length sequence: vLLM would not start
    spare_gib: float | None = None  # KV cache room left beside the batch's prompts (`copies` times over)

    @property
    def per_process(self) -> int:
        return -(-self.inflight // self.processes)


def prompt_tokens(protocol: Protocol, steps: tuple[int, ...]) -> int:
    """The longest prompt of these steps, in tokens (an upper bound: square frames)."""
    return max(TEXT_TOKENS + FRAME_TOKENS * (protocol.steps[s].n_frames or 0) for s in steps)


def many_images(protocol: Protocol, steps: tuple[int, ...]) -> bool:
    return any((protocol.steps[s].n_frames or 0) > 1 for s in steps)


def size(
    protocol: Protocol,
    steps: tuple[int, ...],
    gpu_gib: float | None,
    gpu_util: float,
    max_seqs: int | None = None,
    workers: int | None = None,
    copies: int = 2,
) -> Sizing:
    """The batch and in-flight sizes for a server of these steps' model (`max_seqs`/`workers`: the user's);
    the batch's prompts fit the KV cache `copies` times over."""
    tokens, many = prompt_tokens(protocol, steps), many_images(protocol, steps)
    cap = CAP["many images" if many else "few images"]
    kv_gib = None if gpu_gib is None else _kv_room(protocol, steps, gpu_gib, gpu_util)
    fits = 0 if kv_gib is None else max(0, int(kv_gib * GIB / (tokens * _kv_bytes(protocol, steps))))
    if max_seqs is not None:
        seqs, why = max_seqs, "MAX_SEQS as set"
    elif gpu_gib is None or kv_gib is None:
        seqs, why = min(cap, FALLBACK_SEQS), "GPU memory unknown: the run package's MAX_SEQS"
    else:
        seqs = max(MIN_SEQS, min(cap, _pow2_floor(fits // copies)))
        why = (f"{gpu_gib:.0f} GiB GPU at GPU_UTIL {gpu_util:g}: {max(kv_gib, 0):.1f} GiB of KV cache holds "
               f"{fits:,} prompts of ~{tokens:,} tokens; measured best batch {cap}")  # fmt: skip
    flight = workers if workers is not None else (seqs if many else 2 * seqs)
    how = "WORKERS as set" if workers is not None else ("1 x" if many else "2 x") + " MAX_SEQS"
    procs = 1 if many else max(1, -(-flight // PER_PROCESS))
    spread = f"{procs} worker processes x {-(-flight // procs)}" if procs > 1 else "1 worker process"
    line = f"{steps_label(steps)}: MAX_SEQS {seqs}, {flight} in flight per server ({how}; {spread}); {why}"
    warning = refusal = None
    spare = None if kv_gib is None else kv_gib - copies * seqs * tokens * _kv_bytes(protocol, steps) / GIB
    if gpu_gib is not None and kv_gib is not None:
        head = f"{steps_label(steps)}: {_budget(protocol, steps, gpu_gib, gpu_util, kv_gib)}"
        need = MAX_MODEL_LEN * _kv_bytes(protocol, steps) / GIB
        if kv_gib < need:
            higher = _kv_room(protocol, steps, gpu_gib, HIGH_UTIL)
            raise_util = gpu_util < HIGH_UTIL and higher >= need
            hint = f"GPU_UTIL={HIGH_UTIL:g} leaves {higher:.1f} GiB, or " if raise_util else "use "
            refusal = (f"{head}, less than the {need:.1f} GiB that one {MAX_MODEL_LEN:,}-token sequence needs, so "
                       f"vLLM would not start; {hint}a GPU with more memory")  # fmt: skip
        elif fits < copies * MIN_SEQS:
            warning = (f"{head}: room for {fits:,} prompts of ~{tokens:,} tokens, where a batch of {MIN_SEQS} "
                       f"wants {copies * MIN_SEQS:,}; the screen runs, slowly (best batch: {cap})")  # fmt: skip
    return Sizing(seqs, flight, procs, line, warning, refusal, spare)


def frame_tokens(w: int, h: int) -> int:
    """Qwen3-VL: 16-px patches merged 2x2, sides rounded to multiples of 32 (448x448 -> 196, 448x252 -> 112)."""
    return max(1, round(w / 32)) * max(1, round(h / 32))


def step_budget(per_video: int, steps_held: int, default: int, sized: Sizing) -> tuple[int, str]:
    """`--max-num-batched-tokens` for a many-image group: VIDEOS_PER_STEP videos of `per_video` encoder tokens,
    once per engine step whose encoder outputs the server holds at a time (`steps_held`), up to a power of two;
    never below one full-length prompt. vLLM sizes the vision encoder's budget and its output cache to this
    number, and its activations grow with it: a budget above `default` must fit the KV cache room the batch
    leaves (`sized.spare_gib`), else the largest power of two that does, else `default`. Returns the budget
    and why, in words."""
    want = VIDEOS_PER_STEP * per_video * steps_held
    budget = max(MAX_MODEL_LEN, 1 << (want - 1).bit_length())
    held = "twice over" if steps_held == 2 else "once"
    why = f"{VIDEOS_PER_STEP} videos {held} = {want:,}, up to a power of two"
    if budget <= default:
        return budget, why
    if sized.spare_gib is None:
        return default, f"{why} gives {budget:,}, but the GPU's memory is unknown: the default {default:,}"
    fits = budget
    while fits > default and activation_gib(fits - default) > sized.spare_gib:
        fits //= 2
    room = f"the {max(sized.spare_gib, 0):.1f} GiB of KV cache the batch leaves"
    if fits <= default:
        return default, f"{why} gives {budget:,}, whose activations would not fit {room}: the default {default:,}"
    extra = f"{activation_gib(fits - default):.1f} GiB of activations over {default:,}'s fit {room}"
    return fits, (f"{why}; {extra}" if fits == budget else f"{why} gives {budget:,}, lowered so that {extra}")


def activation_gib(tokens: int) -> float:
    """GPU memory that `tokens` more of the prefill budget take (ACTIVATION_BYTES_PER_TOKEN)."""
    return tokens * ACTIVATION_BYTES_PER_TOKEN / GIB


def _kv_room(protocol: Protocol, steps: tuple[int, ...], gpu_gib: float, gpu_util: float) -> float:
    """GiB left for the KV cache beside the weights and OVERHEAD_GIB (negative: the model does not fit)."""
    return gpu_gib * gpu_util - _weights_gib(protocol, steps) - OVERHEAD_GIB


def _budget(protocol: Protocol, steps: tuple[int, ...], gpu_gib: float, gpu_util: float, kv_gib: float) -> str:
    """Where a GPU's memory goes, in words: its share, the weights, the overhead and the KV cache left."""
    model = protocol.steps[steps[0]].model
    return (f"the GPU's {gpu_gib:.1f} GiB at GPU_UTIL {gpu_util:g} give {gpu_gib * gpu_util:.1f} GiB; {model}'s "
            f"weights take {_weights_gib(protocol, steps):.1f} GiB and ~{OVERHEAD_GIB:.0f} GiB goes to activations, "
            f"leaving {max(kv_gib, 0):.1f} GiB of KV cache")  # fmt: skip


def coserve(protocol: Protocol, gpu_gib: float | None, gpu_util: float) -> dict[tuple[int, ...], float] | None:
    """GPU_UTIL shares for serving both models on one GPU at once, or None when they do not both get their
    best batch. Step 3's preprocessing is CPU-bound and leaves the GPU idle half the time; steps 1-2
    fill it: together they did 1.43 times the work of the two one after the other (h200.md). The
    many-image group gets what its best batch needs once (one batch in flight, and siblings share their
    frames' KV through the prefix cache), in steps of 0.05; the rest must hold the other group's best
    batch twice over, as alone. An H200 at 0.85: 0.40 for the 2B, 0.45 for the 8B; a 32 GB card: None."""
    groups = protocol.model_groups()
    many = [g for g in groups if many_images(protocol, g)]
    few = [g for g in groups if not many_images(protocol, g)]
    if gpu_gib is None or len(many) != 1 or len(few) != 1:
        return None
    need = CAP["many images"] * prompt_tokens(protocol, many[0]) * _kv_bytes(protocol, many[0]) / GIB
    share = math.ceil(20 * (need + _weights_gib(protocol, many[0]) + OVERHEAD_GIB) / gpu_gib) / 20
    rest = round(gpu_util - share, 2)
    if rest <= 0 or size(protocol, few[0], gpu_gib, rest).max_seqs < CAP["few images"]:
        return None
    return {few[0]: rest, many[0]: share}


def _weights_gib(protocol: Protocol, steps: tuple[int, ...]) -> float:
    """bf16 weights of the steps' model; an unknown model is sized as the larger one."""
    return WEIGHTS_GIB.get(protocol.steps[steps[0]].model, max(WEIGHTS_GIB.values()))


def _kv_bytes(protocol: Protocol, steps: tuple[int, ...]) -> int:
    return KV_BYTES.get(protocol.steps[steps[0]].model, max(KV_BYTES.values()))


def _pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n > 0 else 0


def gpu_memory_gib(device: str) -> float | None:
    """Total memory of one GPU (as CUDA_VISIBLE_DEVICES names it), from nvidia-smi; None when unknown."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", device],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        return float(out.stdout.split()[0]) / 1024 if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
