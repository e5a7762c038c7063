"""Screening protocol v1: every rule that decides whether an item is removed, in one place.

The wording, permutation scheme, frame rule, resolution, models and thresholds are data (a
`Protocol` object, loadable from JSON), so the origin's exact prompt or seeds can be swapped in
without touching code; any change yields a new fingerprint, and rows of different fingerprints
are never mixed.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import ProtocolError

LN2 = math.log(2.0)
BATCH_PATH = "/v1/chat/completions/batch"  # vLLM 0.22 and later: a video's items as one request
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
MAX_OPTIONS = len(LETTERS)


def image_part(url: str, uuid: str | None = None) -> dict[str, Any]:
    """A frame of a conversation. With `uuid` (a content hash) a server with a processor cache processes it
    once; an empty `url` with a `uuid` asks that server for the frame it cached under that uuid."""
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": url}}
    if uuid is not None:
        part["uuid"] = uuid
    return part


def lists_batch(openapi: bytes) -> bool:
    """Whether a server's /openapi.json lists the batch endpoint: the one sign of it that is not guessed from a
    404 (vLLM also answers 404 for a model it does not serve). The workers and pool-launch both ask it."""
    try:
        paths = json.loads(openapi).get("paths")
    except (ValueError, AttributeError):
        return False
    return isinstance(paths, dict) and BATCH_PATH in paths


class StepSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    revision: str
    served_name: str = Field(description="name the vLLM server serves the model under (not fingerprinted)")
    frames: Literal["none", "middle", "uniform"]
    n_frames: int = 0
    n_orders: int = 1
    min_hits: int = 1


# The pinned models, written once (the simulator's profiles read them from here too).
QWEN3_VL_8B = StepSpec(
    model="Qwen/Qwen3-VL-8B-Instruct",
    revision="0c351dd01ed87e9c1b53cbc748cba10e6187ff3b",
    served_name="Qwen/Qwen3-VL-8B-Instruct",
    frames="none",
)
QWEN3_VL_2B = StepSpec(
    model="Qwen/Qwen3-VL-2B-Instruct",
    revision="89644892e4d85e24eaac8bacfd4f463576704203",
    served_name="Qwen/Qwen3-VL-2B-Instruct",
    frames="none",
)


class Protocol(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")  # a misspelled key is an error, never a default

    name: str = "v1"
    question_template: str = "{question}\n{options}\n{instruction}"
    option_template: str = "{letter}. {text}"
    instruction: str = "Answer with the option's letter from the given choices directly."
    assistant_prefill: str = "Answer:"
    permutation: Literal["cyclic", "seeded"] = "cyclic"
    cyclic_shifts: tuple[int, ...] = (0, 1, 2, 3)
    seeds: tuple[int, ...] = ()
    image_long_side: int = 448
    jpeg_quality: int = 95
    top_logprobs: int = 20
    margin_threshold: float = LN2
    steps: dict[int, StepSpec] = Field(
        default_factory=lambda: {
            1: QWEN3_VL_8B.model_copy(update={"n_orders": 4, "min_hits": 3}),
            2: QWEN3_VL_8B.model_copy(update={"frames": "middle", "n_frames": 1}),
            3: QWEN3_VL_2B.model_copy(update={"frames": "uniform", "n_frames": 32}),
        }
    )

    @model_validator(mode="after")
    def _check(self) -> Protocol:
        if sorted(self.steps) != [1, 2, 3]:
            raise ValueError("a protocol defines steps 1, 2 and 3")
        n1 = self.steps[1].n_orders
        if self.permutation == "cyclic" and len(self.cyclic_shifts) != n1:
            raise ValueError(f"cyclic_shifts needs {n1} entries (one per step-1 order)")
        if self.permutation == "seeded" and len(self.seeds) != n1:
            raise ValueError(f"seeds needs {n1} entries (one per step-1 order)")
        return self

    # ---- the step graph ------------------------------------------------------------------------

    def next_step(self, step: int) -> int | None:
        """The step an item that survives `step` goes to (None after the last)."""
        later = [s for s in sorted(self.steps) if s > step]
        return later[0] if later else None

    def prev_step(self, step: int) -> int | None:
        """The step whose survivors feed `step` (None for the first)."""
        earlier = [s for s in sorted(self.steps) if s < step]
        return earlier[-1] if earlier else None

    def model_groups(self) -> list[tuple[int, ...]]:
        """The steps each served model answers, one tuple per model in step order: one server type each."""
        groups: dict[tuple[str, str, str], list[int]] = {}
        for step in sorted(self.steps):
            spec = self.steps[step]
            groups.setdefault((spec.model, spec.revision, spec.served_name), []).append(step)
        return [tuple(g) for g in groups.values()]

    def model_group(self, step: int) -> tuple[int, ...]:
        """The steps served by the model that serves `step`."""
        return next(g for g in self.model_groups() if step in g)

    @classmethod
    def load(cls, path: Path | None) -> Protocol:
        """The built-in v1, or a protocol file (JSON) replacing it."""
        if path is None:
            return cls()
        try:
            return cls.model_validate_json(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise ProtocolError(f"protocol file {path}: {e.strerror or e}") from e
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "(file)"
            more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
            what = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
            raise ProtocolError(f"protocol file {path}: {where}: {what}{more}") from e

    @cached_property
    def fingerprint(self) -> str:
        """Hash over everything that changes what the model sees or how its answer is judged."""
        data = self.model_dump(mode="json")
        for spec in data["steps"].values():
            spec.pop("served_name")
        canon = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return f"{self.name}-{hashlib.sha256(canon.encode()).hexdigest()[:16]}"

    # ---- option orders -------------------------------------------------------------------------

    def order(self, item_id: str, n: int, k: int) -> list[int]:
        """Display order k of an item with n options: shown letter j holds original option order[j]."""
        if self.permutation == "cyclic":
            shift = self.cyclic_shifts[k] % n
            return [(j + shift) % n for j in range(n)]
        perm = list(range(n))
        random.Random(f"{self.seeds[k]}:{item_id}").shuffle(perm)
        return perm

    def orders(self, step: int, item_id: str, n: int) -> list[list[int]]:
        return [self.order(item_id, n, k) for k in range(self.steps[step].n_orders)]

    # ---- request -------------------------------------------------------------------------------

    def prompt_text(self, question: str, options: Sequence[str]) -> str:
        lines = "\n".join(self.option_template.format(letter=LETTERS[i], text=t) for i, t in enumerate(options))
        return self.question_template.format(question=question, options=lines, instruction=self.instruction)

    def request_body(
        self, step: int, question: str, options: Sequence[str], image_urls: Sequence[str] = ()
    ) -> dict[str, Any]:
        """The chat-completion body of one forward, exactly as protocol v1 fixes it."""
        parts = [image_part(u) for u in image_urls]
        return {"model": self.steps[step].served_name, "messages": self.messages(question, options, parts),
                **self.sampling}  # fmt: skip

    def batch_body(self, step: int, conversations: Sequence[list[dict[str, Any]]]) -> dict[str, Any]:
        """One /v1/chat/completions/batch body: several forwards' `messages`, the same sampling for each."""
        return {"model": self.steps[step].served_name, "messages": list(conversations), **self.sampling}

    def messages(self, question: str, options: Sequence[str], images: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """One forward's conversation: the frames' parts, the question, and the prefilled answer."""
        content = [*images, {"type": "text", "text": self.prompt_text(question, options)}]
        return [{"role": "user", "content": content}, {"role": "assistant", "content": self.assistant_prefill}]

    @property
    def sampling(self) -> dict[str, Any]:
        """What every forward asks of the server: continue the prefill by one token, its top-k log-probs."""
        return {
            "continue_final_message": True,
            "add_generation_prompt": False,
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": self.top_logprobs,
        }

    # ---- frames --------------------------------------------------------------------------------

    def frame_indices(self, step: int, n: int) -> list[int]:
        """Indices into the naturally sorted frame list that a step sends."""
        spec = self.steps[step]
        if spec.frames == "none" or n <= 0:
            return []
        if spec.frames == "middle":
            return [(n - 1) // 2]
        m = spec.n_frames
        if n < m:
            return list(range(n))
        return [round(i * (n - 1) / (m - 1)) for i in range(m)]

    # ---- judging -------------------------------------------------------------------------------

    def judge_forward(self, top: Sequence[tuple[str, float]], n_options: int, gold: int) -> Forward:
        """Letter log-probabilities, pred and margin of one forward from its top-k list."""
        if not top:
            raise ValueError("response has an empty top_logprobs list")
        floor = min(lp for _, lp in top)
        per_letter: dict[str, list[float]] = {}
        for tok, lp in top:
            per_letter.setdefault(tok.strip(), []).append(lp)
        lps: list[float] = []
        floored: list[bool] = []
        for i in range(n_options):
            vals = per_letter.get(LETTERS[i])
            floored.append(vals is None)
            lps.append(floor if vals is None else _logsumexp(vals))
        pred = max(range(n_options), key=lambda i: (lps[i], -i))
        margin = lps[gold] - max(lp for i, lp in enumerate(lps) if i != gold)
        return Forward(
            logprobs=lps,
            floored=floored,
            pred=pred,
            gold=gold,
            margin=margin,
            hit=pred == gold and not floored[gold],
        )

    def judge_item(self, step: int, orders: Sequence[Sequence[int]], forwards: Sequence[Forward]) -> Verdict:
        """An item's verdict at a step from its judged forwards (one per order, in `orders`' order)."""
        return Verdict(
            removed=self.removed(step, forwards),
            pred=LETTERS[orders[0][forwards[0].pred]],  # the original option the first order's pick stands for
            margin=sum(f.margin for f in forwards) / len(forwards),
            n_hits=sum(f.hit for f in forwards),
            n_perm=len(forwards),
        )

    def removed(self, step: int, forwards: Sequence[Forward]) -> bool:
        """Step 1: >= min_hits orders right and mean margin > threshold; steps 2-3: hit and margin > t."""
        spec = self.steps[step]
        if len(forwards) != spec.n_orders:
            raise ValueError(f"step {step} judges {spec.n_orders} forwards, got {len(forwards)}")
        hits = sum(f.hit for f in forwards)
        mean_margin = sum(f.margin for f in forwards) / len(forwards)
        return hits >= spec.min_hits and mean_margin > self.margin_threshold


class Verdict(BaseModel):
    """An item's outcome at one step: what its row records beside the forwards."""

    removed: bool
    pred: str  # letter of the original option picked in the first order
    margin: float  # steps 2-3: the margin; step 1: the mean over the orders
    n_hits: int
    n_perm: int


class Forward(BaseModel):
    """What one forward said about the letters (indices are letter positions in its order)."""

    logprobs: list[float]
    floored: list[bool]
    pred: int
    gold: int
    margin: float
    hit: bool


def _logsumexp(vals: Sequence[float]) -> float:
    if len(vals) == 1:
        return vals[0]
    m = max(vals)
    return m + math.log(sum(math.exp(v - m) for v in vals))
