"""The producer: a step's remaining items into Redis as chunk jobs, idempotent, reconciled from the store.

Remaining = eligible(step) per the protocol, minus items the store already settled, minus items
already queued, running or failed. Running it twice enqueues nothing new; after Redis lost everything
it re-creates exactly the missing work. `pool-enqueue` prints what `produce` returns; pool-launch,
pool-demo and the tests call it directly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import redis

from ..errors import SetupError
from ..inputs.items import ItemSet
from ..proc.progress import count_progress
from ..protocol import Protocol
from ..store.store import Store
from .plan import Plan, make_plan
from .queue import BATCH, Screen, cuts
from .rescue import rescue


@dataclass(frozen=True)
class Produced:
    plan: Plan
    items: int  # enqueued now
    jobs: int  # created now
    retried: int  # failed jobs cleared for a new run (retry_failed)
    failed: int  # jobs failed for good, their items held
    seconds: float
    redis_error: str | None = None  # plan only: Redis unreachable, so the plan ignores queued work

    @property
    def remaining(self) -> int:
        """The run package's REMAINING_TOTAL (`Plan.remaining_total`)."""
        return self.plan.remaining_total


def rescue_abandoned(protocol: Protocol, screen: Screen) -> int:
    """Jobs of dead workers back on their queues, for every step (once, before planning)."""
    try:
        return rescue(screen.conn, [screen.queue(n) for n in protocol.steps])
    except (redis.AuthenticationError, redis.OutOfMemoryError):  # named by cli.reports_errors
        raise
    except redis.RedisError as e:
        raise SetupError(f"cannot reach Redis: {e}") from e


def produce(
    protocol: Protocol,
    step: int,
    items: ItemSet,
    store: Store,
    screen: Screen | None,
    frames_dir: Path,
    chunk_size: int,
    *,
    limit: int | None = None,
    retry_failed: bool = False,
    plan_only: bool = False,
) -> Produced:
    """Plan `step` and, unless `plan_only`, enqueue what remains. Without Redis a plan is still made
    (ignoring queued work); enqueueing raises SetupError."""
    t0 = time.perf_counter()
    held: list[str] = []
    n_failed = retried = 0
    redis_error = None
    try:
        if screen is not None:
            if retry_failed and not plan_only:
                retried = screen.forget_failed(step)
            q = screen.snapshot([step])[step]
            held = [i for c in screen.payloads([*q.pending, *q.failed]).values() for i in c.items]
            n_failed = len(q.failed)
    except (redis.AuthenticationError, redis.OutOfMemoryError):  # named by cli.reports_errors
        raise
    except redis.RedisError as e:
        if not plan_only:
            raise SetupError(f"cannot reach Redis: {e}") from e
        redis_error = str(e)
    plan = make_plan(protocol, step, items.items, store, frames_dir, held)
    rem = plan.remaining if limit is None else plan.remaining.slice(0, limit)
    todo, videos = rem.column("item_id").to_pylist(), rem.column("video_id").to_pylist()
    jobs = 0
    if not plan_only and todo and screen is not None:
        has_rows = store.index(step).num_rows > 0  # a recovery: workers may be finishing some of these items
        with count_progress(f"enqueue step {step}", len(todo)) as advance:
            for i, j in cuts(len(todo), BATCH * chunk_size, videos):  # pipelines of whole videos too
                jobs += screen.enqueue_chunks(step, todo[i:j], chunk_size, has_rows, videos[i:j])
                advance(j - i)
    enqueued = len(todo) if not plan_only and screen is not None else 0
    return Produced(plan, enqueued, jobs, retried, n_failed, time.perf_counter() - t0, redis_error)
