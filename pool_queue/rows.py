"""The result row: one per item and step, as the run package requires. Its schema lives here: the
pydantic models for the JSONL store, and the one Arrow schema every step's Parquet export shares."""

from __future__ import annotations

from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, field_validator

from .text import printable

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
    prompt_tokens: int | None = None  # None when the server's answer has no per-forward count (a batch)
    attempts: int = 1
    latency_s: float = 0.0
    sent: Literal["single", "batch"] = "single"  # its own request, or one conversation of a batch request


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

    @field_validator("error")
    @classmethod
    def _printable(cls, v: str | None) -> str | None:
        """An error may quote a file name that is not valid UTF-8: escaped, so the row is always written."""
        return None if v is None else printable(v)


# Every step's export has exactly these types, nulls included, so the step files read as one table
# (pyarrow.dataset, duckdb `select * from 'export/*.parquet'`, pandas). A test ties them to the models.
TOKEN = pa.struct([("token", pa.string()), ("logprob", pa.float64())])
FORWARD = pa.struct(
    [
        ("order", pa.list_(pa.int32())),
        ("gold", pa.string()),
        ("logprobs", pa.map_(pa.string(), pa.float64())),
        ("floored", pa.list_(pa.string())),
        ("pred", pa.string()),
        ("margin", pa.float64()),
        ("hit", pa.bool_()),
        ("top", pa.list_(TOKEN)),
        ("prompt_tokens", pa.int32()),
        ("attempts", pa.int32()),
        ("latency_s", pa.float64()),
        ("sent", pa.string()),
    ]
)
ROW_SCHEMA = pa.schema(
    [
        ("item_id", pa.string()),
        ("step", pa.int32()),
        ("status", pa.string()),
        ("benchmark", pa.string()),
        ("video_id", pa.string()),
        ("error", pa.string()),
        ("error_kind", pa.string()),
        ("attempts", pa.int32()),
        ("removed", pa.bool_()),
        ("pred", pa.string()),
        ("margin", pa.float64()),
        ("n_hits", pa.int32()),
        ("n_perm", pa.int32()),
        ("forwards", pa.list_(FORWARD)),
        ("frame_indices", pa.list_(pa.int32())),
        ("n_frames_total", pa.int32()),
        ("fingerprint", pa.string()),
        ("model", pa.string()),
        ("revision", pa.string()),
        ("server", pa.string()),
        ("worker", pa.string()),
        ("started_at", pa.float64()),  # Unix seconds, as in the JSONL rows
        ("finished_at", pa.float64()),
    ]
)


def to_arrow(rows: list[dict[str, Any]]) -> pa.Table:
    """Stored rows (JSON dicts) as a table of ROW_SCHEMA; the raw top-k pairs become (token, logprob) structs."""
    fixed = [
        {**r, "forwards": [{**f, "top": [{"token": t, "logprob": lp} for t, lp in f["top"]]} for f in r["forwards"]]}
        for r in rows
    ]
    return pa.Table.from_pylist(fixed, schema=ROW_SCHEMA)
