"""Where each vLLM process spends its time: a py-spy `--format raw` profile as short tables.

Record it on the GPU host while a benchmark runs (benchmarks/h200.sh profile PORT SECONDS FILE:
`py-spy record --subprocesses --threads --format raw`), then read it anywhere:
  python benchmarks/profile_summary.py prof.txt [--top 12]
Per process and thread: samples (share of the recording = busy fraction of one core), then the
functions with the most samples on top of the stack (self) and anywhere in it (inclusive).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import table


def parse(text: str) -> tuple[Counter[str], dict[str, Counter[str]], dict[str, Counter[str]]]:
    per_thread: Counter[str] = Counter()
    self_: dict[str, Counter[str]] = {}
    incl: dict[str, Counter[str]] = {}
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        parts = stack.split(";")
        procs = [p for p in parts if p.startswith("process ")]
        threads = [p for p in parts if p.startswith("thread ")]
        frames = [p for p in parts if not p.startswith(("process ", "thread "))]
        pid, _, cmd = procs[-1].removeprefix("process ").partition(":") if procs else ("?", "", "")
        proc = f"{pid} " + cmd.strip('"')[:40]
        key = f"{proc} / {threads[-1].split(': ', 1)[-1] if threads else '-'}"
        n = int(count)
        per_thread[key] += n
        if frames:
            self_.setdefault(key, Counter())[frames[-1]] += n
            for f in set(frames):
                incl.setdefault(key, Counter())[f] += n
    return per_thread, self_, incl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", type=Path)
    ap.add_argument("--top", type=int, default=12, help="functions per thread")
    ap.add_argument("--threads", type=int, default=6, help="busiest threads shown in detail")
    ap.add_argument("--rate", type=float, default=50, help="the recording's samples per second")
    ap.add_argument("--seconds", type=float, help="the recording's length (for the busy column)")
    args = ap.parse_args()
    per_thread, self_, incl = parse(args.profile.read_text())
    span = args.seconds or 1.0
    busy = "busy (cores)" if args.seconds else "-"
    thread_rows = [[k, n, n / args.rate / span if args.seconds else "-"] for k, n in per_thread.most_common()]
    print(table(["process / thread", "samples", busy], thread_rows))
    for key, n in per_thread.most_common(args.threads):
        print(f"\n## {key}: {n} samples")
        top_self = self_.get(key, Counter()).most_common(args.top)
        rows = [[f[:110], c, 100 * c / n, incl[key][f] * 100 / n] for f, c in top_self]
        print(table(["self function", "samples", "self %", "inclusive %"], rows))
        top_incl = [[f[:110], 100 * c / n] for f, c in incl[key].most_common(args.top * 3) if 100 * c / n < 99][
            : args.top
        ]
        print(table(["inclusive function", "%"], top_incl))


if __name__ == "__main__":
    main()
