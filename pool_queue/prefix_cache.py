"""vLLM's prefix-cache hit rate per step: what sending a video's items together buys (steps 2 and 3).

Each worker reads its server's two counters (`vllm:prefix_cache_queries_total` and
`vllm:prefix_cache_hits_total`, in prompt tokens, since the server started) every few seconds. It
charges each change to the steps whose forwards it finished meanwhile, in proportion to their prompt
tokens, and keeps the sums in one small JSON file per worker run under `<results>/prefix_cache/`
(replaced atomically). pool-status and the report add the files up. When several workers share one
server, each charges the server's whole change: the rate stays right, the token sums are a multiple.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ValidationError

QUERIES = "vllm:prefix_cache_queries_total"
HITS = "vllm:prefix_cache_hits_total"
DIR = "prefix_cache"
log = logging.getLogger(__name__)
_SAMPLE = re.compile(r"^(vllm:prefix_cache_(?:queries|hits)_total)(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.M)


def parse(text: str) -> tuple[float, float] | None:
    """(queries, hits) summed over label sets; None when the server does not export them."""
    sums: dict[str, float] = {}
    for name, value in _SAMPLE.findall(text):
        sums[name] = sums.get(name, 0.0) + float(value)
    return (sums[QUERIES], sums.get(HITS, 0.0)) if QUERIES in sums else None


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
