"""The result row: one per item and step, as the run package requires. Its schema lives here."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

Status = Literal["ok", "error"]
# permanent: the server refused the request (HTTP 400, no logprobs); bad_input: the item's own data cannot
# be used (frames, fields); transient: retries ran out; internal: a bug in pool-queue. The first two are
# final; the last two are re-attempted by a later pool-enqueue until the item has MAX_ITEM_RUNS such rows.
ErrorKind = Literal["permanent", "bad_input", "transient", "internal"]
FINAL_ERRORS = ("permanent", "bad_input")


class ForwardRecord(BaseModel):
    """One forward: the order shown, what each letter got, and the raw top-k list."""

    model_config = ConfigDict(extra="forbid")

    order: list[int]  # shown letter j holds original option order[j]
    gold: str  # gold letter in this order
    logprobs: dict[str, float]  # per option letter, after spelling merge and floor
    floored: list[str]  # letters absent from the top-k (given the floor)
    pred: str
    margin: float
    hit: bool
    top: list[tuple[str, float]]  # raw top-k (token, logprob), as the server sent it
    prompt_tokens: int | None = None
    attempts: int = 1
    latency_s: float = 0.0


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid")

    item_id: str
    step: int
    status: Status
    benchmark: str
    video_id: str = ""
    error: str | None = None
    error_kind: ErrorKind | None = None
    attempts: int = 0  # HTTP attempts over all forwards of the item
    removed: bool | None = None
    pred: str | None = None  # steps 2-3: the single forward's pred; step 1: pred of order 0
    margin: float | None = None  # steps 2-3: the margin; step 1: the mean margin over orders
    n_hits: int | None = None
    n_perm: int | None = None
    forwards: list[ForwardRecord] = []
    frame_indices: list[int] = []
    n_frames_total: int | None = None
    fingerprint: str
    model: str
    revision: str
    server: str
    worker: str
    started_at: float
    finished_at: float
