"""A three-step screen under a seeded schedule of faults, checked against what lands.

    python benchmarks/chaos.py --items 6000 --faults 25 --seed 7 [--baseline]

Redis with an append-only file, two 8B and one 2B simulator, one worker per simulator kept alive by
the supervisor pool-launch uses. Faults fire at seeded points of progress:
- kill -9 of a worker (after it heartbeated), or SIGSTOP of one past its lease (woken 3 leases later);
- kill -9 of a simulator (back 1-3 s later on its port), or SIGSTOP of one (a hung server, woken after
  twice the silent bound);
- kill -9 of Redis (back from its append-only file), Redis at its maxmemory for 2 leases, and FLUSHALL
  followed by the README's recovery (`pool-enqueue --step all`);
- a worker's results disk refusing rows for 2 leases (a file-size limit: EFBIG, as a full disk);
- a worker restarted with its clock 2 minutes behind or ahead (it stays so).
Nothing else is done by hand. Checked at the end: every item has one settled row per step it
reaches, removed and margin equal the queue-free reference, no two rows of an item disagree,
`pool-audit --complete` is clean. Printed: faults, items lost, duplicate rows (agreeing and not),
and per fault kind the time from the fault to the jobs it held running again, wall time (and the
fault-free run's).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

# The chaos run itself is test harness (tests/e2e/test_chaos.py runs it too, and tests import no benchmark):
# this script adds its folder to the path and only parses, runs and prints.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "harness"))

from _util import table
from chaos_run import Config, run_chaos


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=20_000)
    ap.add_argument("--videos", type=int)
    ap.add_argument("--faults", type=int, default=40)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--speed", type=float, default=4.0)
    ap.add_argument("--lease-s", type=int, default=3)
    ap.add_argument("--baseline", action="store_true", help="also run without faults, for the wall-time ratio")
    ap.add_argument("--workdir", type=Path, help="default: a temporary folder")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="chaos-"))
    base = Config(items=args.items, videos=args.videos or max(50, args.items // 5), seed=args.seed, speed=args.speed)
    base = Config(**{**base.__dict__, "lease_s": args.lease_s, "faults": args.faults, "timeout_s": 3600.0})
    runs = []
    if args.baseline:
        runs.append(("no faults", run_chaos(Config(**{**base.__dict__, "faults": 0}), work)))
    runs.append((f"{args.faults} faults", run_chaos(base, work)))
    for label, rep in runs:
        print(f"{label}: " + "; ".join(rep.faults) if rep.faults else f"{label}: -", file=sys.stderr)
    rows = []
    for label, rep in runs:
        q, r = (rep.back_queued_s + rep.back_queued_overlapped_s) or [0.0], rep.back_running_s or [0.0]
        audit = "clean" if rep.audit_ok else "PROBLEMS"
        rows.append([label, len(rep.faults), rep.items_lost, rep.wrong, rep.dup_agreeing, rep.dup_disagreeing,
                     f"{statistics.median(q):.1f}/{max(q):.1f}", f"{statistics.median(r):.1f}/{max(r):.1f}",
                     rep.wall_s, audit])  # fmt: skip
    print(f"chaos: {args.items} items, lease {args.lease_s} s, seed {args.seed}, workdir {work}")
    print(table(["run", "faults", "lost", "wrong", "dup agree", "dup disagree", "queued again s (med/max)",
                 "running again s (med/max)", "wall s", "audit"], rows))  # fmt: skip
    rep = runs[-1][1]
    per_kind = []
    for kind in sorted(set(rep.kinds)):
        moved = rep.moved_s.get(kind, [])
        spread = f"{statistics.median(moved):.1f}/{max(moved):.1f}" if moved else "-"
        per_kind.append([kind, rep.kinds.count(kind), len(moved), spread])
    print(table(["fault kind", "fired", "with jobs held", "held jobs running again s (med/max)"], per_kind))
    print(f"held jobs deleted by FLUSHALL before they ran again: {rep.flushed} (their items re-queued by the recovery)")
    if not all(rep.ok for _, rep in runs):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
