"""A step's remaining items onto the queue, as pool-enqueue does it and pool-launch and pool-demo do it too:
the frame check that refuses steps with frames while their frame cache is short (`check_frames`), then, step
by step, the plan printed and its work enqueued (`run_steps`, `show`) through `jobs.produce`."""

from __future__ import annotations

import sys

import redis
from rich.console import Console
from rich.table import Table

from ..errors import InputError, SetupError
from ..inputs.items import ItemSet, load_items
from ..protocol import Protocol
from ..settings import Settings
from ..store.store import Store
from ..text import counted
from .plan import frames_refusal
from .produce import Produced, produce, rescue_abandoned
from .queue import Screen, screen_of


def run_steps(
    settings: Settings,
    protocol: Protocol,
    steps: list[int],
    plan_only: bool,
    limit: int | None = None,
    retry_failed: bool = False,
    label: bool = True,
    frames_checked: bool = False,
) -> tuple[Screen | None, dict[int, int]]:
    """What pool-enqueue does, for pool-launch and pool-demo too: plan (and enqueue) each step in order,
    printing the plan and `[STEP=N ]REMAINING_TOTAL=<n>`; first `check_frames`, unless the caller ran it before
    it started anything (`frames_checked`). Returns the screen (None while unstamped) and each step's
    REMAINING_TOTAL."""
    con = Console(stderr=True)
    store = Store(
        settings.results_dir, protocol.fingerprint, protocol.model_dump(mode="json"), settings.results_named()
    )
    store.check_stamp()
    items = load_items(settings.items_dir, settings.root_named())
    if not frames_checked:
        check_frames(settings, protocol, steps, plan_only, items, store)
    if not plan_only:
        # before the stamp is written: a Redis that is not there is named, with where its URL came from
        reach_redis(settings)
        store.claim()  # the stamp's token names the screen in Redis
    if items.rejected.num_rows:
        con.print(f"[yellow]{items.rejected.num_rows} invalid items are not screened (see `pool-items`)[/]")
    screen = screen_of(store, settings.redis())
    if screen is not None and not plan_only and (n := rescue_abandoned(protocol, screen)):
        con.print(f"re-queued {n} abandoned job(s)")
    remaining = {}
    for step in steps:
        done = produce(protocol, step, items, store, screen, settings.frames_dir, settings.chunk_size, limit=limit,
                       retry_failed=retry_failed, plan_only=plan_only)  # fmt: skip
        show(con, done, screen.queue_name(step) if screen else "", settings.redis_said())
        print(f"STEP={step} REMAINING_TOTAL={done.remaining}" if label else f"REMAINING_TOTAL={done.remaining}")
        remaining[step] = done.remaining
    return screen, remaining


def check_frames(
    settings: Settings,
    protocol: Protocol,
    steps: list[int],
    plan_only: bool = False,
    items: ItemSet | None = None,
    store: Store | None = None,
) -> None:
    """Steps with frames only with the frame cache they need (`plan.frames_refusal`): else one line naming the
    cache and the commands that fill it (InputError: exit 2), before anything is claimed, queued or started.
    A plan, or a screen told that the videos are meant to be missing, says the same as a warning and goes on."""
    items = items or load_items(settings.items_dir, settings.root_named())
    store = store or Store(settings.results_dir, protocol.fingerprint)
    why = frames_refusal(protocol, steps, items.items, store, settings.frames_dir, settings.frames_tar_dir)
    if why is None:
        return
    if settings.allow_missing_frames:
        print(f"warning: {why} (screened without them: --allow-missing-frames)", file=sys.stderr, flush=True)
        return
    fill = (f"fill it with `pool-frames` (extracts the shards in {settings.frames_tar_dir}) or `pool-fetch --frames` "
            "(downloads them first), or pass --allow-missing-frames (POOL_ALLOW_MISSING_FRAMES=1) when these videos "
            "are meant to be missing")  # fmt: skip
    if plan_only:
        print(f"warning: {why}; a screen is refused until you {fill}", file=sys.stderr, flush=True)
        return
    raise InputError(f"{why}; {fill}")


def reach_redis(settings: Settings) -> None:
    """One PING: a Redis that does not answer is one line (SetupError) naming it and, where a `.env` gave its
    URL, that file (a stopped demo's Redis: what to do about it)."""
    try:
        settings.redis().ping()
    except (redis.AuthenticationError, redis.OutOfMemoryError):  # named by cli.reports_errors
        raise
    except redis.RedisError as e:
        raise SetupError(settings.demo_gone() or f"cannot reach Redis at {settings.redis_said()}: {e}") from None


def show(con: Console, done: Produced, queue: str, redis: str) -> None:
    """The plan per benchmark and what was enqueued (also what pool-launch prints per step); `redis`: the Redis
    named as `Settings.redis_said` names it (with the `.env` its URL came from)."""
    plan, step = done.plan, done.plan.step
    if done.redis_error:
        con.print(f"[yellow]Redis at {redis} unreachable ({done.redis_error}); the plan ignores queued work[/]")
    if done.retried:
        con.print(f"step {step}: {done.retried} failed job(s) will run again")
    t = Table("benchmark", "eligible", "to enqueue", title=f"step {step} plan")
    for bench, n_elig, n_todo in plan.by_benchmark():
        t.add_row(bench, str(n_elig), str(n_todo))
    t.add_row("[b]total[/]", str(plan.eligible.num_rows), str(plan.remaining.num_rows))
    con.print(t)
    con.print(
        f"eligible {plan.eligible.num_rows}, settled in store {plan.settled}, queued, running or failed {plan.pending}"
    )
    if plan.waits_on:
        before = f"step {plan.before}"
        con.print(f"[yellow]step {step}: {before} is not complete: up to {plan.waits_on} more item(s) may become "
                  f"eligible (items an earlier step has not settled yet, of videos with frames where this step "
                  f"needs them: any of them may survive to reach it), so REMAINING_TOTAL is an upper bound until "
                  f"{before} finishes[/]")  # fmt: skip
    if done.failed:
        con.print(
            f"[yellow]step {step}: {done.failed} job(s) failed for good and are held (pool-status shows why); "
            "--retry-failed runs them again[/]"
        )
    if done.items:
        items, jobs = counted(done.items, "item"), counted(done.jobs, "job")
        con.print(f"enqueued {items} as {jobs} on {queue} in {done.seconds:.1f} s")
