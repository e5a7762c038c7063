"""Fault injection, reproducible from a seed.

A fault is chosen from the request's content and how many times that content has been seen, not
from arrival order, so the same client run meets the same faults whatever the interleaving; a
retry of a faulted request (a new sighting) draws again. A schedule names request numbers
(arrival order) for faults that must happen at a known point of a run.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

# "stale": the 500 of vLLM's API server when its processor cache and the engine's disagree on an image (an
# AssertionError, "Expected a cached item for mm_hash=...", reported against 0.2x releases)
KINDS = ("500", "503", "429", "hang", "reset", "malformed", "nologprobs", "stale")


def _entries(spec: str) -> list[tuple[str, str]]:
    """'a:b, c:d' -> [('a', 'b'), ('c', 'd')]."""
    return [tuple(p.strip().split(":", 1)) for p in spec.split(",") if p.strip()]  # type: ignore[misc]


def _kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown fault {kind!r}; known: {', '.join(KINDS)}")
    return kind


def parse_rates(spec: str) -> dict[str, float]:
    """'500:0.01,hang:0.002' -> {'500': 0.01, 'hang': 0.002}."""
    rates = {_kind(kind): float(rate) for kind, rate in _entries(spec)}
    if sum(rates.values()) > 1:
        raise ValueError("fault rates add up to more than 1")
    return rates


def parse_schedule(spec: str) -> dict[int, str]:
    """'5:503,6-9:reset' -> {5: '503', 6: 'reset', ..., 9: 'reset'} (1-based request numbers)."""
    out: dict[int, str] = {}
    for span, kind in _entries(spec):
        lo, _, hi = span.partition("-")
        out.update(dict.fromkeys(range(int(lo), int(hi or lo) + 1), _kind(kind)))
    return out


@dataclass
class FaultPlan:
    seed: int = 0
    rates: dict[str, float] = field(default_factory=dict)
    schedule: dict[int, str] = field(default_factory=dict)
    _seen: Counter[bytes] = field(default_factory=Counter)
    _arrivals: int = 0

    def draw(self, body: bytes, items: Sequence[bytes] = ()) -> str | None:
        """The fault of one request, if any. A batch request is one arrival for the schedule, but draws by rate
        once for each of its conversations (`items`, keyed by each one's content): a fault on any fails the whole
        batch, as vLLM fails a batch when one of its conversations fails."""
        self._arrivals += 1
        if self._arrivals in self.schedule:
            return self.schedule[self._arrivals]
        if not self.rates:
            return None
        kinds = [self._by_rate(x) for x in items or (body,)]
        return next((k for k in kinds if k is not None), None)

    def _by_rate(self, content: bytes) -> str | None:
        key = hashlib.blake2b(content, digest_size=12).digest()
        self._seen[key] += 1
        h = hashlib.blake2b(key + f"{self.seed}:{self._seen[key]}".encode(), digest_size=8).digest()
        u = int.from_bytes(h, "big") / 2**64
        for kind, rate in self.rates.items():
            if u < rate:
                return kind
            u -= rate
        return None
