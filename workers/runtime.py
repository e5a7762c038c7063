"""The worker loop: jobs from RQ -> items -> forwards (bounded in flight) -> rows on disk -> ack -> chain.

Several jobs run at once so the server never drains between chunks: a new job is taken while the
forwards still queued locally would keep the server busy for about two more rounds. Background duties
live in `upkeep`; what stops the worker taking work for a while (a silent server, a full disk) in `holds`.
A worker is made from its `WorkerConfig` (every value it runs with, as one object) and its live parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

import pyarrow as pa
from rq.serializers import JSONSerializer

from pool_queue.errors import RedisGone, ServerMisconfigured
from pool_queue.inputs.items import ItemSet
from pool_queue.jobs import lease as leases
from pool_queue.jobs.queue import Screen
from pool_queue.observe import prefix_cache, presence
from pool_queue.protocol import Protocol
from pool_queue.rows import Row
from pool_queue.store.store import SegmentWriter, Store, StoreWriteError
from pool_queue.text import printable

from . import upkeep
from .chain import already_final, follow_up
from .client import VLLMClient
from .config import WorkerConfig
from .holds import Holds
from .metrics import Metrics
from .redis_link import RedisLink
from .screen import Identity, Item, Screener
from .slots import Slots
from .upkeep import Counters
from .waiting import Stop, Stopped

log = logging.getLogger(__name__)
T = TypeVar("T")
NOT_IN_TABLE = "item not in the item table (changed since it was enqueued?)"
HOLD_PROBE_S = 2.0  # how often a held worker probes its server or its disk


class Worker:
    def __init__(
        self,
        config: WorkerConfig,
        *,
        protocol: Protocol,
        items: ItemSet,
        store: Store,
        screen: Screen,
        client: VLLMClient,
        stop: Stop,
    ) -> None:
        self.config = config
        self.protocol = protocol
        self.items = items
        self.by_id = items.by_id
        self.store = store
        self.screen = screen
        self.conn = screen.conn
        self.link = RedisLink(config.redis, config.wait_redis_s, config.name, config.note_s,
                              settle_s=3 * config.timing.heartbeat_s)  # fmt: skip
        self.client = client
        self.queues = [screen.queue(step) for step in sorted(config.steps, reverse=True)]  # later steps first
        self.all_queues = [screen.queue(step) for step in protocol.steps]
        self.inflight = Slots(config.max_inflight)
        spec = protocol.steps[config.steps[0]]
        self.screener = Screener(
            protocol,
            client,
            config.frames_dir,
            Identity(protocol.fingerprint, spec.model, spec.revision, config.server, config.name),
            self.inflight,
            config.max_frame_pixels,
            config.video_send,
        )
        self.writers: dict[int, SegmentWriter] = {}
        self.active: dict[str, leases.Lease] = {}
        self.jobs_changed = asyncio.Event()  # `active` changed (and at start): RQ's view of us follows (upkeep)
        self.jobs_changed.set()
        self.runs: dict[str, asyncio.Task[None]] = {}  # job id -> its task
        self.writing = 0  # jobs waiting on a write of their rows: a failed one is said by its own job
        self.reserved: dict[str, int] = {}  # job id -> its forwards counted in the backlog before its items start
        self.holds = Holds(config.name, config.note_s)
        self.backlog = 0  # forwards of claimed jobs not yet answered (or found settled)
        # Store reads (re-checks, follow-ups) are Arrow work over a whole step's index: one at a time, on one
        # thread. A pool of threads ran dozens at once after a recovery, each with its own copy (3x the RSS).
        self.reader = ThreadPoolExecutor(1, thread_name_prefix=f"{config.name[:10]}-store")
        self.stop = stop
        stop.in_flight = lambda: len(self.runs)
        self.more = asyncio.Event()
        self.fatal: BaseException | None = None
        self.count = Counters()
        self.metrics = Metrics(lambda: self.screener.in_flight)
        self.metrics_url: str | None = None
        self.last_error: str | None = None
        self.rate = presence.RateWindow()
        self.cache = prefix_cache.Meter.for_worker(store.root, config.name, config.server)
        self.engine = prefix_cache.EngineMeter()
        self.rq: leases.ShownWorker  # made in run(): its constructor already talks to Redis

    def _rq_worker(self) -> leases.ShownWorker:
        """RQ's view of us (`rq info`): its key outlives a kill by worker_ttl + 60 s at most."""
        ttl = max(10, int(3 * self.config.timing.heartbeat_s))
        names = [q.name for q in self.queues]
        w = leases.ShownWorker(
            names, name=self.config.name, connection=self.conn, serializer=JSONSerializer, worker_ttl=ttl
        )
        w.register_birth()  # type: ignore[no-untyped-call]
        return w

    # ---- lifecycle ------------------------------------------------------------------------------

    async def run(self) -> int:
        """Work until the stop (SIGTERM/SIGINT) or, in a burst, until the queues are empty. Exit code."""
        try:
            self.rq = await self.link.call(self._rq_worker, stop=self.stop)
        except RedisGone as e:  # Redis not reached at start: a setting to fix (exit 2), not an outage to outlive
            log.error("%s: cannot start: %s (--wait-redis)", self.config.name, e)
            return 2
        except Stopped:
            log.info("%s: stopped while waiting for Redis at the start", self.config.name)
            return 0
        if self.config.metrics_port is not None:
            port = self.metrics.serve(self.config.metrics_port)
            self.metrics_url = f"http://{socket.gethostname()}:{port}/metrics"
            log.info("%s: metrics on %s", self.config.name, self.metrics_url)
        await self.link.attempt(upkeep.beat, self)  # seen by pool-status at once, not one heartbeat later
        side = upkeep.tasks(self)
        runs, told = self.runs, 0
        try:
            while not self.stop.event.is_set():
                self._hold_for_torn_tails()
                told = await self._tell_holds(told)
                if self.holds and not await self.holds.clear():
                    if self.config.burst and not runs and await self._drained():
                        break
                    await _first(self.stop.event.wait(), asyncio.sleep(HOLD_PROBE_S))
                    continue
                told = await self._tell_holds(told)
                if self.backlog >= 2 * self.config.max_inflight:
                    self.more.clear()
                    await _first(self.more.wait(), self.stop.event.wait())
                    continue
                lease = await self._claim()
                if lease is None:
                    if self.config.burst and not runs and await self._drained():
                        break
                    await _first(self.stop.event.wait(), asyncio.sleep(self.config.poll_s))
                    continue
                self._start(lease)
            if runs:  # each job ends its own lease: acknowledged, failed or given back
                log.info("%s: stopping: finishing %d job(s) in flight", self.config.name, len(runs))
                await asyncio.gather(*runs.values(), return_exceptions=True)
        finally:
            for t in side:
                t.cancel()
            with contextlib.suppress(Exception):
                await upkeep.cache_share(self)  # the last interval's share
            await self.link.attempt(self.rq.register_death)  # our name is free again at once
            with contextlib.suppress(Exception):
                await self.link.attempt(presence.withdraw, self.conn, self.config.name)
            for w in self.writers.values():
                w.close()
            self.reader.shutdown(wait=False)
            upkeep.log_progress(self)
        if self.fatal is not None:
            log.error("%s: stopped: %s", self.config.name, self.fatal)
            return 4 if isinstance(self.fatal, RedisGone) else 3
        return 0

    async def _tell_holds(self, told: int) -> int:
        """Publish our presence at once when a hold began or ended since `told` lines: the launcher's console
        says it (`presence.HoldNews`) without waiting for the next heartbeat. The lines said so far."""
        if self.holds.n_said != told:
            await self.link.attempt(presence.publish, self.conn, upkeep.snapshot(self))
        return self.holds.n_said

    async def _claim(self) -> leases.Lease | None:
        try:
            return await self.link.call(
                leases.claim, self.screen, self.queues, self.config.name, self.config.timing.lease_s, stop=self.stop
            )
        except RedisGone as e:
            self._stop(e)
        except Stopped:  # nothing claimed: the loop sees the stop
            pass
        except Exception as e:  # never let one odd job or reply end the worker
            log.exception("%s: taking a job failed; going on", self.config.name)
            self.last_error = f"claim: {type(e).__name__}: {e}"[:300]
        return None

    async def _drained(self) -> bool:
        """A burst worker's end: no job of its steps waits or runs anywhere; says so in one line (whether it
        took any job, so an empty queue is never a silent exit)."""
        if await self._work_left() or self.stop.event.is_set():
            return False
        steps = ",".join(map(str, self.config.steps))
        if self.count.jobs:
            log.info("%s: burst: the queues of step(s) %s are empty; exiting", self.config.name, steps)
        else:
            log.info("%s: burst: nothing queued for step(s) %s (pool-enqueue --step N puts work there); exiting",
                     self.config.name, steps)  # fmt: skip
        return True

    async def _work_left(self) -> bool:
        """Jobs of our queues waiting or held by other workers: a burst worker waits, their lease may expire."""
        try:
            return await self.link.call(self.screen.busy, self.config.steps, stop=self.stop)
        except RedisGone as e:
            self._stop(e)
            return False
        except Stopped:
            return False

    def _stop(self, why: BaseException) -> None:
        self.fatal = why
        self.stop.event.set()

    def _hold_disk(self, why: str, back: str, probe: Callable[[], bool]) -> None:
        if self.holds.begin("disk", why, back, partial(asyncio.to_thread, probe)):
            self.hand_back()  # their rows could not be written either: their forwards would be lost

    def _hold_for_torn_tails(self) -> None:
        """A partial line that a refused write left and no hold is cutting: the write failed after its job
        was handed back (the task was cancelled while its thread wrote), so its error reached no one. The
        worker holds until the line is cut, as after an error it saw itself."""
        torn = self.store.torn
        # while a job waits on its write, a tail it left is its own to say, with the cause: its error is on the
        # way (the thread's result reaches the task a loop turn later); a cancelled job stops waiting at once
        if torn and "disk" not in self.holds and not self.writing:
            self._hold_disk("a refused write left a partial line", "its partial line is cut", torn.repair)

    def hand_back(self) -> None:
        """Give every running job back to the queue (each job's task does it as it is cancelled; the
        caller's own task, if it is one, gives its job back itself)."""
        me = asyncio.current_task()
        for t in list(self.runs.values()):
            if t is not me:
                t.cancel()

    # ---- one job --------------------------------------------------------------------------------

    def _start(self, lease: leases.Lease) -> None:
        """A claimed job counts its forwards in the backlog at once, so jobs that are first re-checked (after a
        recovery, most are settled) are claimed a few at a time, not by the hundred."""
        job, spec = lease.job.id, self.protocol.steps.get(lease.payload.step)  # an unknown step fails in the job
        self.active[job] = lease
        self.jobs_changed.set()
        self.reserved[job] = (spec.n_orders if spec else 1) * len(lease.payload.items)
        self.backlog += self.reserved[job]
        self.runs[job] = task = asyncio.create_task(self._run_job(lease))
        task.add_done_callback(partial(self._ended, job))

    def _ended(self, job: str, _: object) -> None:
        """The job's reservation, and a task cancelled before it ran (a hand-back right after the claim): its
        lease is no longer renewed, so it expires and the job runs again."""
        self._release(job)
        self._drop(job)

    def _drop(self, job: str) -> None:
        """The job is no longer ours to renew or show: its lease ended (or expires, after a cancel)."""
        if self.active.pop(job, None) is not None:
            self.jobs_changed.set()
        self.runs.pop(job, None)

    def _release(self, job: str) -> None:
        self._answered(self.reserved.pop(job, 0), None)

    async def _run_job(self, lease: leases.Lease) -> None:
        step, ids = lease.payload.step, lease.payload.items
        try:
            skip = await self._read(already_final, self.store, step, ids) if lease.check_store else set()
            todo = [i for i in ids if i not in skip]
            n_fw = self.protocol.steps[step].n_orders
            found = self._items(todo)
            groups = self._groups(step, todo, found)
            each = [asyncio.ensure_future(self._screen(step, g, found)) for g in groups]
            self.backlog += n_fw * len(todo)
            for t, g in zip(each, groups, strict=True):  # a done-callback runs even for a task cancelled unstarted
                t.add_done_callback(partial(self._answered, n_fw * len(g)))
            self._release(lease.job.id)  # from here its items count, each group until answered
            rows = [r for group in await asyncio.gather(*each) for r in group]
            if self.fatal is not None and not isinstance(self.fatal, RedisGone):
                raise self.fatal
            dumped = [r.model_dump(mode="json") for r in rows]
            self.writing += 1
            try:
                await asyncio.to_thread(self._writer(step).write, dumped)  # on disk before the ack
            finally:
                self.writing -= 1
            follow = await self._read(
                follow_up, self.protocol, self.store, self.config.frames_dir, self._videos, step, rows, skip
            )
            await self.link.call(leases.finish, self.screen, lease, follow, self.protocol.next_step(step), self.rq)
            self.count.jobs += 1
            self.metrics.jobs.inc()
        except ServerMisconfigured as e:  # no item is at fault: the job goes back untouched
            self._stop(e)
            await self._end(leases.give_back, self.conn, lease)
        except RedisGone as e:  # rows are on disk; the lease expires and the job is re-run, skipping them
            self._stop(e)
        except asyncio.CancelledError:  # handed back (a silent server): rows written so far stay
            await self._end(leases.give_back, self.conn, lease, False)
        except StoreWriteError as e:  # nothing of the batch is on disk; other workers run it, we wait
            back = f"rows can be written to {e.folder} again"
            self._hold_disk(str(e.strerror), back, e.cleared)
            self.last_error = str(e.strerror)
            await self._end(leases.give_back, self.conn, lease, False)
        except Exception as e:
            reason = printable(f"{type(e).__name__}: {e}")  # it goes to Redis and the status view: valid UTF-8
            self.last_error = f"job {lease.job.id}: {reason}"[:300]
            name, max_failures = self.config.name, self.config.timing.max_failures
            log.exception("%s: job %s raised (run %d)", name, lease.job.id, lease.failures + 1)
            final = await self._end(leases.fail, self.conn, lease, reason, name, max_failures, self.rq)
            if final:
                log.error("%s: job %s failed %d times: in the failed registry", name, lease.job.id, lease.failures)
        finally:  # here, not one loop tick later in _ended: a heartbeat must not renew an ended lease
            self._drop(lease.job.id)

    async def _end(self, fn: Callable[..., bool], *args: object) -> bool:
        try:
            return await self.link.call(fn, *args)
        except RedisGone as e:
            self._stop(e)
            return False

    def _answered(self, n_fw: int, _: object) -> None:
        if n_fw:
            self.backlog -= n_fw
            self.more.set()

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.reader, partial(fn, *args))

    def _groups(self, step: int, ids: list[str], found: dict[str, Item]) -> list[list[str]]:
        """The job's items as the screener sends them: a video's items together where the server takes
        batches (one request), else one by one; either way a video's items adjacent, as vLLM then reuses
        its frames. Ids the item table lacks go alone."""
        if self.protocol.steps[step].frames == "none":
            return [[i] for i in ids]
        by_video: dict[str, list[str]] = {}
        for i in ids:
            by_video.setdefault(found[i].video_id if i in found else "", []).append(i)
        loose = by_video.pop("", [])
        if not self.screener.batch:
            return [[i] for v in sorted(by_video) for i in by_video[v]] + [[i] for i in loose]
        return [by_video[v] for v in sorted(by_video)] + [[i] for i in loose]

    async def _screen(self, step: int, ids: list[str], found: dict[str, Item]) -> list[Row]:
        """Rows of a group of items (one, or a video's), whatever happens to them."""
        try:
            rows = [self.screener.error_row(step, i, NOT_IN_TABLE, "bad_input") for i in ids if i not in found]
            rows += await self.screener.screen_group(step, [found[i] for i in ids if i in found])
        except ServerMisconfigured as e:  # the job is given back whole: these rows are never written
            self._stop(e)
            rows = [self.screener.error_row(step, i, str(e), "internal") for i in ids]
        except Exception as e:  # reading the item table itself failed: a bug, these items only
            log.exception("%s: items %s, step %s: internal error", self.config.name, ids[:3], step)
            rows = [self.screener.error_row(step, i, f"{type(e).__name__}: {e}", "internal") for i in ids]
        for row in rows:
            self.count.items += 1
            self.count.forwards += len(row.forwards)
            self.count.errors += row.status == "error"
            self.count.removed += bool(row.removed)
            self.metrics.observe(row, self.client.retries)
            if row.status == "error":
                self.last_error = f"{row.item_id}: {row.error}"[:300]
        return rows

    def _items(self, ids: list[str]) -> dict[str, Item]:
        """A job's items, with one take() from the item table (ids it does not know are left out)."""
        idx = pa.array([self.by_id[i] for i in ids if i in self.by_id], pa.int64())  # typed: an empty job is fine
        rows = self.items.items.take(idx).to_pylist()
        return {r["item_id"]: Item(r["item_id"], r["benchmark"], r["video_id"], r["question"], r["options"], r["gold"])
                for r in rows}  # fmt: skip

    def _writer(self, step: int) -> SegmentWriter:
        if step not in self.writers:
            self.writers[step] = self.store.writer(step, self.config.name)
        return self.writers[step]

    def _videos(self, ids: list[str]) -> dict[str, str]:
        return {i: it.video_id for i, it in self._items(ids).items()}


async def _first(*aws: object) -> None:
    """Wait until the first of several awaitables finishes; cancel the rest."""
    tasks = [asyncio.ensure_future(aw) for aw in aws]  # type: ignore[call-overload]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t


def unique_name(server: str, name: str | None) -> str:
    """`<name or server>.<host>.<random>`: a restarted worker never waits for its dead self's key to expire,
    and the prefix still tells which server a worker feeds."""
    prefix = name or server.split("://", 1)[-1].rstrip("/").replace(":", "-")
    return f"{prefix}.{socket.gethostname()}.{secrets.token_hex(3)}"
