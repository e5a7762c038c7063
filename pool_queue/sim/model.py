"""The simulated model: a deterministic answer distribution from the request content alone.

The synthetic pool generator uses the same hash functions to choose each item's gold answer (the
option the simulated model "believes") and to place each benchmark's questions in a band of
blind-answerability, so a screen over a synthetic pool removes realistic, known fractions.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from dataclasses import dataclass

from ..launch.sizing import MAX_MODEL_LEN
from ..protocol import QWEN3_VL_2B, QWEN3_VL_8B

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_OPTION_LINE = re.compile(r"^([A-Z])\. (.*)$")
FILLER_TOKENS = (
    " The",
    " I",
    "\n",
    " Based",
    " It",
    " Option",
    " This",
    " None",
    " **",
    " (",
    ":",
    " a",
    " the",
    " answer",
    " Answer",
    "\n\n",
    " In",
    " We",
    " To",
    " Yes",
    " No",
    " From",
    " As",
)


def unit(*parts: str) -> float:
    """A uniform number in [0, 1) fixed by its inputs."""
    h = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


def blind_knowledge(question: str) -> float:
    return unit("blind", question)


def visual_knowledge(question: str) -> float:
    return unit("visual", question)


def believed_option(question: str, options: list[str]) -> int:
    """Index of the option the model believes right; the generator makes it the gold answer."""
    return max(range(len(options)), key=lambda i: unit("truth", question, options[i]))


@dataclass(frozen=True)
class Profile:
    name: str
    model: str
    revision: str
    max_model_len: int
    tokens_per_s: float  # server-wide prompt-token throughput when all sequences are busy
    base_latency_s: float
    blind_scale: float
    visual_gain: float


PROFILES = {
    "qwen3-vl-8b": Profile(
        "qwen3-vl-8b",
        QWEN3_VL_8B.model,
        QWEN3_VL_8B.revision,
        MAX_MODEL_LEN,  # what pool-launch gives the real server: the demo refuses what a real run refuses
        60_000.0,
        0.02,
        7.0,
        3.0,
    ),
    "qwen3-vl-2b": Profile(
        "qwen3-vl-2b",
        QWEN3_VL_2B.model,
        QWEN3_VL_2B.revision,
        MAX_MODEL_LEN,
        25_000.0,
        0.05,
        5.0,
        1.4,
    ),
}


def profile_of(model: str) -> Profile:
    """The profile simulating a hub model id (pool-launch names the protocol's model)."""
    for prof in PROFILES.values():
        if prof.model == model:
            return prof
    known = sorted(p.model for p in PROFILES.values())
    raise ValueError(f"no simulated profile for {model}; the simulator knows {known}")


def parse_prompt(text: str) -> tuple[str, list[str]]:
    """Question and options from a protocol prompt ("A. text" lines); instruction lines ignored."""
    q_lines: list[str] = []
    options: list[str] = []
    for line in text.split("\n"):
        m = _OPTION_LINE.match(line)
        if m and m.group(1) == LETTERS[len(options)]:
            options.append(m.group(2))
        elif not options:
            q_lines.append(line)
    return "\n".join(q_lines), options


def answer(profile: Profile, text: str, n_images: int, top_k: int) -> list[tuple[str, float]]:
    """Top-k (token, logprob) of the first generated token, sampled (top-1) first, rest unsorted."""
    question, options = parse_prompt(text)
    rng = random.Random(hashlib.blake2b(f"{profile.name}\x1f{n_images}\x1f{text}".encode(), digest_size=8).digest())
    n = len(options)
    logits: list[float] = []
    if n:
        truth = believed_option(question, options)
        strength = profile.blind_scale * (blind_knowledge(question) - 0.5)
        if n_images:
            strength += profile.visual_gain * visual_knowledge(question) * (1.0 + math.log(n_images))
        for j in range(n):
            bias = 0.5 if j == 0 else (0.2 if j == 1 else 0.0)  # letter-position bias towards A, B
            logits.append(bias + rng.gauss(0.0, 0.6) + (strength if j == truth else 0.0))
    letter_mass = 0.92 if n else 0.0
    top = max(logits, default=0.0)
    z = sum(math.exp(v - top) for v in logits) or 1.0
    cands: list[tuple[str, float]] = []
    for j, v in enumerate(logits):
        p = letter_mass * math.exp(v - top) / z
        bare_share = 0.1 + 0.2 * rng.random() if rng.random() < 0.5 else 0.0
        cands.append((" " + LETTERS[j], math.log(p * (1 - bare_share))))
        if bare_share:
            cands.append((LETTERS[j], math.log(p * bare_share)))
    rest = 1.0 - letter_mass
    for i, tok in enumerate(FILLER_TOKENS):
        share = rest * 0.5 ** (i + 1)
        cands.append((tok, math.log(share) if share > 0 else -9999.0))
    cands.sort(key=lambda c: c[1], reverse=True)
    chosen = [(t, max(lp, -9999.0)) for t, lp in cands[:top_k]]
    tail = chosen[1:]
    rng.shuffle(tail)
    return [chosen[0], *tail]
