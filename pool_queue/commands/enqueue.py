"""pool-enqueue: put a step's remaining items into Redis as chunk jobs (idempotent; reconciles from the store).

Remaining = eligible(step) per protocol v1, minus items the store already settled, minus items
already queued or running. Running it twice enqueues nothing new; after Redis lost everything it
re-creates exactly the missing work (`--step all`: every step in order, the recovery after Redis lost
its data). Jobs that failed for good are held until --retry-failed. --plan-only prints the plan and
REMAINING_TOTAL=<n>.
"""

from __future__ import annotations

import argparse
import time

import redis
from rich.console import Console
from rich.table import Table

from ..items import ItemsError, ItemSet, load_items
from ..lease import rescue
from ..plan import make_plan
from ..progress import count_progress
from ..queue import BATCH, Screen, cuts, screen_of
from ..settings import Settings
from ..store import STEPS, Store, StoreError
from ._cli import fail, load_protocol, parser, settings


def main(argv: list[str] | None = None) -> None:
    p = parser("pool-enqueue", __doc__ or "")
    p.add_argument(
        "--step", choices=("1", "2", "3", "all"), required=True, help="a step, or all (in order: the recovery)"
    )
    p.add_argument("--plan-only", action="store_true", help="print the plan and REMAINING_TOTAL; enqueue nothing")
    p.add_argument("--chunk-size", type=int, help="items per job (default 64; POOL_CHUNK_SIZE)")
    p.add_argument("--limit", type=int, help="enqueue at most this many items")
    p.add_argument("--retry-failed", action="store_true", help="run the items of failed jobs again")
    a = p.parse_args(argv)
    s = settings(a, chunk_size=a.chunk_size)
    con = Console(stderr=True)
    protocol = load_protocol(s)
    store = Store(s.results_dir, protocol.fingerprint, protocol.model_dump(mode="json"))
    try:
        store.check_stamp()
        items = load_items(s.items_dir)
        if not a.plan_only:
            store.claim()  # the stamp's token names the screen in Redis
    except (StoreError, ItemsError) as e:
        fail(str(e))
    if items.rejected.num_rows:
        con.print(f"[yellow]{items.rejected.num_rows} invalid items are not screened (see `pool-items`)[/]")
    screen = screen_of(store, s.redis())
    if screen is not None and not a.plan_only:
        try:  # once, for every step: jobs of dead workers back on their queues before planning
            rescued = rescue(screen.conn, [screen.queue(n) for n in STEPS])
        except redis.RedisError as e:
            fail(f"cannot reach Redis at {s.redis_where()}: {e}")
        if rescued:
            con.print(f"re-queued {rescued} abandoned job(s)")
    if a.step != "all":
        print(f"REMAINING_TOTAL={_one_step(a, s, con, items, store, screen, int(a.step))}")
        return
    for step in STEPS:
        print(f"STEP={step} REMAINING_TOTAL={_one_step(a, s, con, items, store, screen, step)}")


def _one_step(
    a: argparse.Namespace, s: Settings, con: Console, items: ItemSet, store: Store, screen: Screen | None, step: int
) -> int:
    t0 = time.perf_counter()
    held: list[str] = []
    n_failed = 0
    try:
        if screen is not None:
            if a.retry_failed and not a.plan_only:
                n = screen.forget_failed(step)
                if n:
                    con.print(f"step {step}: {n} failed job(s) will run again")
            q = screen.snapshot([step])[step]
            held = [i for c in screen.payloads([*q.pending, *q.failed]).values() for i in c.items]
            n_failed = len(q.failed)
    except redis.RedisError as e:
        if not a.plan_only:
            fail(f"cannot reach Redis at {s.redis_where()}: {e}")
        con.print(f"[yellow]Redis unreachable ({e}); the plan ignores queued work[/]")
    try:
        plan = make_plan(step, items.items, store, s.frames_dir, held)
    except StoreError as e:
        fail(str(e))
    t = Table("benchmark", "eligible", "to enqueue", title=f"step {step} plan")
    for bench, n_elig, n_todo in plan.by_benchmark():
        t.add_row(bench, str(n_elig), str(n_todo))
    t.add_row("[b]total[/]", str(plan.eligible.num_rows), str(plan.remaining.num_rows))
    con.print(t)
    con.print(
        f"eligible {plan.eligible.num_rows}, settled in store {plan.settled}, queued, running or failed {plan.pending}"
    )
    if n_failed:
        con.print(
            f"[yellow]step {step}: {n_failed} job(s) failed for good and are held (pool-status shows why); "
            "--retry-failed runs them again[/]"
        )
    rem = plan.remaining if a.limit is None else plan.remaining.slice(0, a.limit)
    todo, videos = rem.column("item_id").to_pylist(), rem.column("video_id").to_pylist()
    if not a.plan_only and todo and screen is not None:
        jobs = 0
        has_rows = store.index(step).num_rows > 0  # a recovery: workers may be finishing some of these items
        with count_progress(f"enqueue step {step}", len(todo)) as advance:
            for i, j in cuts(len(todo), BATCH * s.chunk_size, videos):  # pipelines of whole videos too
                jobs += screen.enqueue_chunks(step, todo[i:j], s.chunk_size, has_rows, videos[i:j])
                advance(j - i)
        con.print(
            f"enqueued {len(todo)} items as {jobs} jobs on {screen.queue_name(step)} "
            f"in {time.perf_counter() - t0:.1f} s"
        )
    return int(plan.eligible.num_rows - plan.settled)
