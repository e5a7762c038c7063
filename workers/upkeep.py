"""A worker's background duties beside its jobs: leases renewed, dead workers' jobs rescued, the server
watched for silence, its /metrics read (prefix-cache counters, the engine's state), progress logged and
published for pool-status.

The duties see the worker through `Tended`, the part of it they read and touch, so this module needs
nothing of the job loop (`runtime`) that starts them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from redis import Redis
from rq import Queue

from pool_queue.jobs import lease as leases
from pool_queue.jobs.queue import Screen
from pool_queue.jobs.rescue import rescue
from pool_queue.observe import prefix_cache, presence

from .client import VLLMClient
from .config import WorkerConfig
from .holds import Holds
from .redis_link import RedisLink
from .screen import Screener

log = logging.getLogger(__name__)
CACHE_READ_S = 5.0  # how often the server's /metrics are read (prefix-cache counters, the engine's state)
REPORT_S = 10.0


@dataclass
class Counters:
    """A worker's tallies since it started: logged, and published for pool-status."""

    items: int = 0
    errors: int = 0
    removed: int = 0
    forwards: int = 0
    jobs: int = 0
    started: float = field(default_factory=time.monotonic)


class Tended(Protocol):
    """What the duties read and touch of a worker (`runtime.Worker`)."""

    config: WorkerConfig

    screen: Screen
    conn: Redis
    link: RedisLink
    client: VLLMClient
    holds: Holds
    screener: Screener
    rq: leases.ShownWorker
    active: dict[str, leases.Lease]
    jobs_changed: asyncio.Event  # set when `active` changes: RQ's view of the worker follows
    all_queues: list[Queue]
    count: Counters
    rate: presence.RateWindow
    cache: prefix_cache.Meter
    engine: prefix_cache.EngineMeter
    last_error: str | None
    metrics_url: str | None

    def hand_back(self) -> None: ...


def tasks(w: Tended) -> list[asyncio.Task[None]]:
    duties = (heartbeats, show_state, rescues, watch_server, read_cache, report)
    return [asyncio.create_task(duty(w)) for duty in duties]


async def heartbeats(w: Tended) -> None:
    while True:
        await asyncio.sleep(w.config.timing.heartbeat_s)
        try:
            await w.link.attempt(beat, w)  # Redis away: the outage is logged once, leases have slack
        except Exception as e:
            log.warning("%s: heartbeat failed: %s", w.config.name, e)
        w.jobs_changed.set()  # RQ's view again: a write lost to an outage, or a key born again, is right once more


async def show_state(w: Tended) -> None:
    """RQ's view of the worker (`rq info`, rq-dashboard) follows its jobs: busy from the claim of its first job,
    idle once its last one ended, not a heartbeat later. One write at a time, each from the jobs held when it is
    sent, so the last write is the present state whichever Redis thread finishes first."""
    while True:
        await w.jobs_changed.wait()
        w.jobs_changed.clear()
        try:
            await w.link.attempt(leases.show_state, w.rq, list(w.active))
        except Exception as e:  # a display: never worth a worker
            log.warning("%s: showing the worker's state to RQ failed: %s", w.config.name, e)


def beat(w: Tended) -> None:
    leases.heartbeat(w.conn, list(w.active.values()), w.config.timing.lease_s)
    if not w.conn.exists(w.rq.key):  # Redis lost its data (or our key expired): be seen again
        w.rq.register_birth()  # type: ignore[no-untyped-call]
    w.rq.heartbeat()
    presence.publish(w.conn, snapshot(w))


async def rescues(w: Tended) -> None:
    seen: set[str] = set()  # intermediate-list orphans of the previous pass
    while True:
        await asyncio.sleep(w.config.timing.rescue_s)
        try:
            n = await w.link.attempt(rescue, w.conn, w.all_queues, seen)  # every step's: a step whose only
            if n:  # worker died is rescued by the others
                log.warning("%s: re-queued %d abandoned job(s)", w.config.name, n)
        except Exception as e:
            log.warning("%s: rescue failed: %s", w.config.name, e)


async def watch_server(w: Tended) -> None:
    """A server that answers no forward for `silent_s` (wedged, stopped, or a port that never replies):
    its jobs go back to the queue for other workers; this worker takes work again once /health answers."""
    while True:
        bound_s, server = w.config.silent_s, w.config.server
        await asyncio.sleep(min(1.0, bound_s / 4))
        quiet_s = w.client.silent_s()
        if quiet_s > bound_s and w.active:
            why = f"{server} answered no forward for {quiet_s:.0f} s (POOL_SERVER_SILENT_S {bound_s:.0f} s)"
            if w.holds.begin("server", why, f"{server} is back", w.client.healthy):
                w.hand_back()


async def read_cache(w: Tended) -> None:
    while True:
        await asyncio.sleep(CACHE_READ_S)
        try:
            await cache_share(w)
        except Exception as e:  # a statistic: never worth a worker
            log.warning("%s: reading the server's /metrics failed: %s", w.config.name, e)


async def cache_share(w: Tended) -> None:
    """One read of the server's /metrics: its prefix-cache counters charged to the steps, its engine's view kept
    for the next snapshot."""
    sums = await w.client.server_metrics()
    tokens, w.screener.tokens = dict(w.screener.tokens), Counter()
    w.engine.read(sums)
    await asyncio.to_thread(w.cache.charge, prefix_cache.counters(sums), tokens)


async def report(w: Tended) -> None:
    while True:
        await asyncio.sleep(REPORT_S)
        log_progress(w)


def snapshot(w: Tended) -> presence.WorkerSnapshot:
    c, now = w.count, time.monotonic()
    items_per_s, forwards_per_s = w.rate.rates(now, c.items, c.forwards)
    return presence.WorkerSnapshot(
        name=w.config.name,
        screen=w.screen.id,
        server=w.config.server,
        steps=list(w.config.steps),
        host=socket.gethostname(),
        pid=os.getpid(),
        max_inflight=w.config.max_inflight,
        inflight=w.screener.in_flight,
        inflight_cost=w.screener.inflight.held,
        active_jobs=len(w.active),
        items=c.items,
        forwards=c.forwards,
        errors=c.errors,
        removed=c.removed,
        retries=w.client.retries,
        items_per_s=items_per_s,
        forwards_per_s=forwards_per_s,
        outage_s=w.client.outage_s,
        server_up=w.client.up and "server" not in w.holds,
        held=w.holds.describe(),
        hold_lines=list(w.holds.said),
        hold_said=w.holds.n_said,
        last_error=w.last_error,
        metrics_url=w.metrics_url,
        engine=w.engine.view,
        started_at=time.time() - (now - c.started),
        updated_at=time.time(),
    )


def log_progress(w: Tended) -> None:
    c = w.count
    elapsed_s = max(1e-9, time.monotonic() - c.started)
    log.info(
        "%s: %d items (%.1f/s), %d forwards (%.1f/s), %d removed, %d errors, %d jobs, %d retries, outage %.0f s",
        w.config.name,
        c.items,
        c.items / elapsed_s,
        c.forwards,
        c.forwards / elapsed_s,
        c.removed,
        c.errors,
        c.jobs,
        w.client.retries,
        w.client.outage_s,
    )
