"""pool-enqueue: put a step's remaining items into Redis as chunk jobs (idempotent; reconciles from the store).

Remaining = eligible(step) per the protocol, minus items the store already settled, minus items
already queued or running. Running it twice enqueues nothing new; after Redis lost everything it
re-creates exactly the missing work (`--step all`: every step in order, the recovery after Redis lost
its data). Jobs that failed for good are held until --retry-failed. --plan-only prints the plan and
REMAINING_TOTAL=<n>. Steps with frames are refused (one line, exit 2, nothing queued) while videos that are
not `k:` have no folder in a frame cache that is absent, empty or short of its manifest, unless
--allow-missing-frames says they are meant to be missing. The work is `pool_queue.jobs.steps` (through
`jobs.produce`); this parses the flags.
"""

from __future__ import annotations

from ..cli import add_allow_missing_frames, load_protocol, number, parser, reports_errors
from ..cli import settings as cli_settings
from ..jobs.steps import run_steps


@reports_errors
def main(argv: list[str] | None = None) -> None:
    p = parser("pool-enqueue", __doc__ or "")
    p.add_argument("--step", required=True, help="a step (1, 2, 3), or all (in order: the recovery)")
    p.add_argument("--plan-only", action="store_true", help="print the plan and REMAINING_TOTAL; enqueue nothing")
    p.add_argument("--chunk-size", type=number(int, 1), help="items per job (default 64; POOL_CHUNK_SIZE)")
    p.add_argument("--limit", type=number(int, 1), help="enqueue at most this many items")
    p.add_argument("--retry-failed", action="store_true", help="run the items of failed jobs again")
    add_allow_missing_frames(p)
    args = p.parse_args(argv)
    settings = cli_settings(args, chunk_size=args.chunk_size, allow_missing_frames=args.allow_missing_frames or None)
    protocol = load_protocol(settings)
    steps = sorted(protocol.steps) if args.step == "all" else [int(args.step)] if args.step.isdigit() else []
    if not steps or not set(steps) <= set(protocol.steps):
        p.error(f"--step {args.step}: choose one of {', '.join(map(str, sorted(protocol.steps)))} or all")
    run_steps(
        settings,
        protocol,
        steps,
        args.plan_only,
        limit=args.limit,
        retry_failed=args.retry_failed,
        label=args.step == "all",
    )
