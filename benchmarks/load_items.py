"""Load + validate a 300,000-item synthetic table: seconds and peak memory (goal < 5 s, < 500 MB).

Usage: python benchmarks/load_items.py [--items 300000]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import table


def measure(items_dir: str) -> None:
    from pool_queue.inputs.items import load_items

    t0 = time.perf_counter()
    item_set = load_items(Path(items_dir))
    dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        table(
            ["items read", "valid", "rejected", "seconds", "peak RSS MB (whole process)"],
            [[item_set.n_read, item_set.items.num_rows, item_set.rejected.num_rows, dt, peak]],
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--items", type=int, default=300_000)
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        return measure(args.measure)
    from pool_queue.demo.synth import SynthConfig, generate

    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "root"
        t0 = time.perf_counter()
        generate(
            root, SynthConfig(n_items=args.items, n_videos=2000, frames=(1, 1), bad_items=True, missing_fraction=1.0)
        )
        print(f"generated {args.items} items in {time.perf_counter() - t0:.1f} s")
        # a fresh process, so peak RSS is the loader's and not the generator's
        subprocess.run([sys.executable, __file__, "--measure", str(root / "items")], check=True)


if __name__ == "__main__":
    main()
