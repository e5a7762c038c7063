"""pool-launch: one model server per GPU (PORT0+i, the GPU pinned), one worker per server, then wait.

With neither `--step` nor `--split` it screens every step on whatever GPUs the host has: one GPU with
room for both models serves them at once (`sizing.coserve`), else the 8B on every GPU for steps 1-2,
then, once their queues are empty, the 2B for step 3.
`--step N` serves that step's model on every GPU and enqueues step N (survivors chain onward, as far
as that model goes); `--split 3+1` serves the 8B (steps 1-2) on the first 3 GPUs and the 2B (step 3)
on the rest, so all steps run at once. A launch that leaves jobs waiting for a model it did not serve
says so at the end, with the command that finishes them.
Logs: logs/vllm_s<STEP>_gpu<i>.log and logs/client_s<STEP>_gpu<i>.log (STEP: the step, the split, or
a phase's steps such as 1-2). `--burst` returns when the queues are empty (the run package's
run_remote.sh); otherwise it runs until SIGTERM, SIGHUP or Ctrl-C (the last phase). Any of those, at
any time, lets the workers finish their jobs before stopping the servers. `--sim` starts simulated
servers instead of vLLM (the CPU demo, the Slurm test). A launch that serves steps 2-3 while videos that are
not `k:` have no folder in a frame cache that is absent, empty or short of its manifest is refused before
anything starts, as pool-enqueue refuses it, unless --allow-missing-frames (POOL_ALLOW_MISSING_FRAMES=1).
"""

from __future__ import annotations

import argparse

from ..cli import add_allow_missing_frames, fail, load_protocol, number, parser, reports_errors
from ..cli import settings as cli_settings
from ..jobs.steps import run_steps
from ..launch.bringup import LaunchRun, SimServers, check_max_seqs, launch
from ..launch.plan import split_counts
from ..protocol import Protocol
from ..settings import url_from_file


@reports_errors
def main(argv: list[str] | None = None) -> None:
    p = parser("pool-launch", __doc__ or "")
    steps = sorted(Protocol().steps)  # a protocol file has the same steps (Protocol checks)
    p.add_argument("--step", type=int, choices=steps, help="serve this step's model on every GPU; enqueue it")
    p.add_argument("--split", help="A+B: the steps-1-2 model on A GPUs and step 3's on B GPUs (e.g. 3+1)")
    p.add_argument(
        "--plan-only", action="store_true", help="print the plan and REMAINING_TOTAL (of --step, or every step)"
    )
    p.add_argument("--burst", action="store_true", help="stop when the queues are empty")
    p.add_argument("--sim", action="store_true", help="simulated servers instead of vLLM (no GPU)")
    p.add_argument(
        "--sim-speed",
        type=number(float, 0.0, above=True),
        default=20.0,
        help="with --sim: capacity-model speed-up (default 20)",
    )
    p.add_argument(
        "--sim-gpu-gib",
        type=number(float, 0.0, above=True),
        help="with --sim: the simulated GPU's memory (default: unknown)",
    )
    p.add_argument(
        "--sim-warmup-s", type=number(float, 0.0), default=0.0, help="with --sim: each server's start-up (/health 503)"
    )
    p.add_argument(
        "--health-timeout",
        dest="health_timeout_s",
        type=number(float, 0.0, above=True),
        default=1200.0,
        help="seconds to wait for every server",
    )
    add_allow_missing_frames(p)
    args = p.parse_args(argv)
    settings = cli_settings(args, allow_missing_frames=args.allow_missing_frames or None)
    protocol = load_protocol(settings)
    _check_args(args, protocol)
    check_max_seqs(settings, protocol)
    sim = SimServers(args.sim_speed, args.sim_warmup_s, args.sim_gpu_gib) if args.sim else None
    folders = tuple(
        f"--{k.replace('_', '-')} {getattr(args, k)}" for k in ("root", "results", "protocol_file") if getattr(args, k)
    )
    run = LaunchRun(settings, protocol, args.step, args.split, args.burst, sim, args.health_timeout_s, folders)
    if args.plan_only:
        run_steps(url_from_file(settings)[0], protocol, run.steps, plan_only=True, label=args.step is None)
        return
    launch(run)


def _check_args(args: argparse.Namespace, protocol: Protocol) -> None:
    """Every flag checked before anything is planned, with or without --plan-only: one line, exit 2."""
    if args.step is not None and args.split:
        fail("give --step N or --split A+B, not both")
    if args.split:
        split_counts(protocol, args.split)


if __name__ == "__main__":
    main()
