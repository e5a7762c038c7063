"""pool-enqueue: put a step's remaining items into Redis as chunk jobs (idempotent; reconciles from the store).

Remaining = eligible(step) per protocol v1, minus items the store already settled, minus items
already queued or running. Running it twice enqueues nothing new; after Redis lost everything it
re-creates exactly the missing work. --plan-only prints the plan and REMAINING_TOTAL=<n>.
"""

from __future__ import annotations

import time

import redis
from rich.console import Console
from rich.table import Table

from ..items import ItemsError, load_items
from ..lease import rescue
from ..plan import make_plan
from ..progress import count_progress
from ..protocol import Protocol
from ..queue import BATCH, enqueue_chunks, job_item_ids, pending_job_ids, step_queue
from ..store import Store, StoreError
from ._cli import fail, parser, settings


def main(argv: list[str] | None = None) -> None:
    p = parser("pool-enqueue", __doc__ or "")
    p.add_argument("--step", type=int, choices=(1, 2, 3), required=True)
    p.add_argument("--plan-only", action="store_true", help="print the plan and REMAINING_TOTAL; enqueue nothing")
    p.add_argument("--chunk-size", type=int, help="items per job (default 64; POOL_CHUNK_SIZE)")
    p.add_argument("--limit", type=int, help="enqueue at most this many items")
    a = p.parse_args(argv)
    s = settings(a, chunk_size=a.chunk_size)
    con = Console(stderr=True)
    protocol = Protocol.load(s.protocol_file)
    store = Store(s.results_dir, protocol.fingerprint)
    t0 = time.perf_counter()
    try:
        store.check_stamp()
        items = load_items(s.items_dir)
    except (StoreError, ItemsError) as e:
        fail(str(e))
    if items.rejected.num_rows:
        con.print(f"[yellow]{items.rejected.num_rows} invalid items are not screened (see `pool-items`)[/]")
    conn = redis.Redis.from_url(s.redis_url, **s.redis_kwargs())
    try:
        rescued = rescue(conn, [step_queue(conn, n) for n in (1, 2, 3)])
        pending = job_item_ids(conn, pending_job_ids(conn, a.step))
    except redis.RedisError as e:
        if not a.plan_only:
            fail(f"cannot reach Redis at {s.redis_url.split('@')[-1]}: {e}")
        con.print(f"[yellow]Redis unreachable ({e}); the plan ignores queued work[/]")
        rescued, pending = 0, []
    if rescued:
        con.print(f"re-queued {rescued} abandoned job(s)")
    try:
        plan = make_plan(a.step, items.items, store, s.frames_dir, pending)
    except StoreError as e:
        fail(str(e))
    t = Table("benchmark", "eligible", "to enqueue", title=f"step {a.step} plan")
    for bench, n_elig, n_todo in plan.by_benchmark():
        t.add_row(bench, str(n_elig), str(n_todo))
    t.add_row("[b]total[/]", str(plan.eligible.num_rows), str(plan.remaining.num_rows))
    con.print(t)
    con.print(f"eligible {plan.eligible.num_rows}, settled in store {plan.settled}, queued or running {plan.pending}")
    todo = plan.remaining.column("item_id").to_pylist()
    if a.limit is not None:
        todo = todo[: a.limit]
    if not a.plan_only and todo:
        jobs = 0
        step_items = BATCH * s.chunk_size
        with count_progress("enqueue", len(todo)) as advance:
            for i in range(0, len(todo), step_items):
                part = todo[i : i + step_items]
                jobs += enqueue_chunks(conn, a.step, part, s.chunk_size)
                advance(len(part))
        con.print(
            f"enqueued {len(todo)} items as {jobs} jobs on {step_queue(conn, a.step).name} "
            f"in {time.perf_counter() - t0:.1f} s"
        )
    print(f"REMAINING_TOTAL={plan.eligible.num_rows - plan.settled}")
