"""pool-synth: write a synthetic package root (items, frames, tar shards) for demos and tests.

The root is written beside its place (or inside it, where an empty folder such as a volume's mount
point is there) and put into place when complete (`synth.build_root`): a Ctrl-C leaves no root that
looks usable. The root is marked synthetic, so its results are never
uploaded to the real dataset.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..cli import Parser, number, reports_errors
from ..demo.synth import SynthConfig, build_root, generate, staging


@reports_errors
def main(argv: list[str] | None = None) -> None:
    p = Parser(prog="pool-synth", description=__doc__)
    p.add_argument("root", type=Path, help="new package root to create")
    p.add_argument("--items", type=number(int, 1), default=2000)
    p.add_argument("--videos", type=number(int, 1), default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-frames", type=number(int, 1), default=8)
    p.add_argument("--max-frames", type=number(int, 1), default=64)
    p.add_argument("--bad-items", action="store_true", help="add a file of invalid items (one per rule)")
    p.add_argument("--items-per-video", type=number(int, 0), default=0, help="exactly N items per video (0: at random)")
    p.add_argument("--corrupt-frames", type=number(int, 0), default=0, help="videos whose frames get damaged")
    args = p.parse_args(argv)
    cfg = SynthConfig(
        n_items=args.items,
        n_videos=args.videos,
        seed=args.seed,
        frames=(args.min_frames, args.max_frames),
        bad_items=args.bad_items,
        corrupt_frames=args.corrupt_frames,
        items_per_video=args.items_per_video,
    )

    t0 = time.perf_counter()
    try:
        summary = build_root(args.root, lambda folder: generate(folder, cfg))
    except KeyboardInterrupt:
        print(f"interrupted: {args.root} was not made (the next run removes {staging(args.root)})", file=sys.stderr)
        raise SystemExit(130) from None
    print(
        f"wrote {args.root}: {summary.n_items} items, {summary.n_videos_with_frames} videos with frames "
        f"({summary.n_frames} frames, {summary.n_shards} shards) in {time.perf_counter() - t0:.1f} s"
    )
