"""What a worker reads of its server's own /metrics: the prefix-cache hit rate per step (what sending a
video's items together buys, steps 2 and 3) and the engine's state (what limits a step now).

Each worker reads its server's two counters (`vllm:prefix_cache_queries_total` and
`vllm:prefix_cache_hits_total`, in prompt tokens, since the server started) every few seconds. It
charges each change to the steps whose forwards it finished meanwhile, in proportion to their prompt
tokens, and keeps the sums in one small JSON file per worker run under `<results>/prefix_cache/`
(replaced atomically). pool-status and the report add the files up. When several workers share one
server, each charges the server's whole change: the rate stays right, the token sums are a multiple.

The same read gives the engine's view (`Engine`): requests running and waiting, the tokens of its steps
since the read before (`vllm:iteration_tokens_total`), KV cache use, and the processor cache's hit rate
(`vllm:mm_cache_*`, from 0.26 on). The worker publishes it with its presence for pool-status.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ValidationError

QUERIES = "vllm:prefix_cache_queries_total"
HITS = "vllm:prefix_cache_hits_total"
DIR = "prefix_cache"
log = logging.getLogger(__name__)
_SAMPLE = re.compile(r"^(vllm:[a-z_]+)(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.M)
# The engine's figures, by their names in vLLM 0.11.0, 0.26.0 and 0.32.0 (vllm/v1/metrics/loggers.py); the
# KV cache's use is `vllm:gpu_cache_usage_perc` before `kv_cache_usage_perc` (0.11.0 exports both).
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
STEP_TOKENS, STEPS = "vllm:iteration_tokens_total_sum", "vllm:iteration_tokens_total_count"
MM_QUERIES, MM_HITS = "vllm:mm_cache_queries_total", "vllm:mm_cache_hits_total"


def samples(text: str) -> dict[str, float]:
    """Every `vllm:` sample of a /metrics page, summed over label sets (a server's engines; a histogram's
    buckets too, a sum no one reads)."""
    sums: dict[str, float] = {}
    for name, value in _SAMPLE.findall(text):
        if not math.isnan(v := float(value)):
            sums[name] = sums.get(name, 0.0) + v
    return sums


def parse(text: str) -> tuple[float, float] | None:
    """(queries, hits) summed over label sets; None when the server does not export them."""
    return counters(samples(text))


def counters(sums: dict[str, float]) -> tuple[float, float] | None:
    return (sums[QUERIES], sums.get(HITS, 0.0)) if QUERIES in sums else None


class Engine(BaseModel):
    """A server's engine as its own /metrics showed it at one read (None: not exported by its release)."""

    running: float  # requests the engine runs now
    waiting: float  # requests admitted by the API server that wait for the engine
    tokens_per_step: float | None = None  # mean tokens of the engine steps since the read before
    steps: float | None = None  # engine steps since the read before
    kv_cache_usage: float | None = None  # share of the KV cache in use
    processor_cache_hit_rate: float | None = None  # the API servers' multimodal cache, since the server started


@dataclass
class EngineMeter:
    """The engine's view from each read; tokens per step over the interval since the read before."""

    last: tuple[float, float] | None = None  # (step tokens, steps) at the read before
    view: Engine | None = None

    def read(self, sums: dict[str, float]) -> Engine | None:
        """The view of this read (kept in `view`); None when the server exports no request counts."""
        if RUNNING not in sums or WAITING not in sums:
            self.view = None
            return None
        tokens_per_step = steps = None
        if STEPS in sums and STEP_TOKENS in sums:
            now, last = (sums[STEP_TOKENS], sums[STEPS]), self.last
            self.last = now
            if last is not None and now[1] >= last[1]:  # else the first read, or a restarted server
                steps = now[1] - last[1]
                tokens_per_step = (now[0] - last[0]) / steps if steps else None
        kv = next((sums[k] for k in KV_USAGE if k in sums), None)
        mm = sums.get(MM_QUERIES)
        hit = sums.get(MM_HITS, 0.0) / mm if mm else None
        self.view = Engine(
            running=sums[RUNNING], waiting=sums[WAITING], tokens_per_step=tokens_per_step, steps=steps,
            kv_cache_usage=kv, processor_cache_hit_rate=hit,
        )  # fmt: skip
        return self.view


class StepCache(BaseModel):
    queries: float = 0.0
    hits: float = 0.0

    @property
    def rate(self) -> float | None:
        return self.hits / self.queries if self.queries > 0 else None


class Tally(BaseModel):
    """One worker run's sums per step (the file's content)."""

    server: str
    steps: dict[int, StepCache] = {}


@dataclass
class Meter:
    """Charges a server's counter changes to the steps that caused them; writes the worker's file."""

    path: Path
    tally: Tally
    last: tuple[float, float] | None = None
    refused: bool = False  # the last write of the file failed (said once until one works)

    @classmethod
    def for_worker(cls, results_dir: Path, worker: str, server: str) -> Meter:
        return cls(results_dir / DIR / f"{worker}.json", Tally(server=server))

    def charge(self, counters: tuple[float, float] | None, tokens_by_step: dict[int, int]) -> None:
        """`tokens_by_step`: prompt tokens of the forwards finished since the last call."""
        if counters is None:
            return
        last, self.last = self.last, counters
        total = sum(tokens_by_step.values())
        if last is None or counters[0] < last[0] or total <= 0:  # first read, a restarted server, or idle
            return
        dq, dh = counters[0] - last[0], counters[1] - last[1]
        for step, tokens in tokens_by_step.items():
            c = self.tally.steps.setdefault(step, StepCache())
            c.queries += dq * tokens / total
            c.hits += dh * tokens / total
        self._save()

    def _save(self) -> None:
        """A statistic: a file the disk refuses is said once (as a write, not as the server's counters) and
        written again at the next change; the sums stay in memory meanwhile."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(self.tally.model_dump_json())
            os.replace(tmp, self.path)
        except OSError as e:
            if not self.refused:
                log.warning("writing the prefix-cache counters to %s failed: %s", self.path, e.strerror or e)
            self.refused = True
        else:
            self.refused = False


def read(results_dir: Path) -> dict[int, StepCache]:
    """Every worker run's sums, added up per step (a file that cannot be read is left out)."""
    out: dict[int, StepCache] = {}
    d = results_dir / DIR
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            t = Tally.model_validate_json(f.read_bytes())
        except (OSError, ValidationError):
            continue
        for step, c in t.steps.items():
            acc = out.setdefault(step, StepCache())
            acc.queries += c.queries
            acc.hits += c.hits
    return out
