"""The whole pool rehearsed on this machine: every stage at any size, and what each costs.

    python benchmarks/rehearsal.py --items 30000 [--workdir DIR]

A pool of the real shape (139 benchmarks, the synthetic benchmarks' option-count mix, ~2.7 items per
video, ~61 % of items with frames, 32-64 448-px JPEG frames per video hard-linked to one video's, so
67,021 folders cost almost no disk) is screened through the real system: Redis with its append-only
file, one simulated server per model at `--speed` times an H200 (so the system, not the server, is
the limit), several workers per model. While it runs: `pool-status --json` every few seconds, one
FLUSHALL followed by `pool-enqueue --step all` (the README's recovery) and one worker killed with
SIGKILL (started again). Then `pool-report`, `pool-audit --complete`, `pool-export` and `pool-pack`
(its checksum verified). Printed: per stage wall, CPU and peak RSS per process kind (from the
kernel: wait4 for commands, /proc for the long-running ones), per-item cost, Redis's peak memory,
status refresh times and output sizes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

# The rehearsal itself is test harness (tests/e2e/test_rehearsal.py runs it too, and tests import no
# benchmark): this script adds its folder to the path and only parses, runs and prints.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "harness"))

from _util import table
from rehearsal_run import Config, Report, run_rehearsal


def print_report(rep: Report) -> None:
    n = rep.items
    rows = [[name, c.wall_s, 1e3 * c.wall_s / n, c.cpu_s, 1e3 * c.cpu_s / n, c.rss_mb,
             "-" if c.out_mb is None else f"{c.out_mb:,.1f}"] for name, c in rep.stages.items()]  # fmt: skip
    print(f"rehearsal: {n:,} items; " + "; ".join(rep.faults))
    print(table(["stage", "wall s", "wall ms/item", "CPU s", "CPU ms/item", "peak RSS MB", "output MB"], rows))
    kinds = [[k, c.cpu_s, 1e3 * c.cpu_s / n, c.rss_mb] for k, c in rep.kinds.items()]
    print(table(["process kind (screen)", "CPU s", "CPU ms/item", "peak RSS MB"], kinds))
    st = rep.status_s or [0.0]
    print(f"Redis peak memory {rep.redis_peak_mb:,.1f} MB; pool-status --json {len(st)} refreshes, "
          f"median {statistics.median(st):.2f} s, max {max(st):.2f} s")  # fmt: skip
    steps = "; ".join(f"step {s}: {d:,}/{e:,} done, {left} left" for s, (e, d, left) in sorted(rep.steps.items()))
    audit, pack = "clean" if rep.audit_ok else "PROBLEMS", "verified" if rep.pack_ok else "-"
    print(f"{steps}; audit {audit}; tarball checksum {pack}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=30_000)
    ap.add_argument("--speed", type=float, default=Config.speed)
    ap.add_argument("--workers", type=int, default=Config.workers, help="workers per model")
    ap.add_argument("--workdir", type=Path, help="default: a temporary folder")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="rehearsal-"))
    rep = run_rehearsal(Config(items=args.items, speed=args.speed, workers=args.workers), work)
    print_report(rep)
    if not (rep.complete and rep.audit_ok and rep.pack_ok):
        print(rep.audit_tail, file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
