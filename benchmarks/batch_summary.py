"""gpu_run.sh's runs side by side: per step the rows and items/s over the step's span (first start to last
finish); over step 3's span the GPU busy, the vLLM processes' CPU per item and the engine cores' busiest
thread (median and p90 of its share of a core, where the sampler wrote it); the prefix-cache hit rate
the workers metered; then the top-20 of every item both runs screened, compared with the first run's.

    python benchmarks/batch_summary.py WORK off auto [--results POOL_ROOT/results]

Reads WORK/RUN/export/parquet/step{1,2,3}.parquet, WORK/RUN/samples.txt (vllm_sampler.py) and
RESULTS/RUN/prefix_cache/*.json for each RUN."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("work", type=Path, help="gpu_run.sh's WORK folder: a folder per run")
ap.add_argument("runs", nargs="+", help="the runs' names; the first is the reference the others are compared with")
ap.add_argument("--results", type=Path, default=Path("/root/pool/results"), help="the runs' results roots' parent")
args = ap.parse_args()
E: Path = args.work
MODES: tuple[str, ...] = tuple(args.runs)


def samples(mode: str) -> list[tuple[float, ...]]:
    return [tuple(map(float, line.split())) for line in (E / mode / "samples.txt").read_text().splitlines()]


def window(rows: list[dict[str, Any]]) -> tuple[float, float]:
    return min(r["started_at"] for r in rows), max(r["finished_at"] for r in rows)


def over(sampled: list[tuple[float, ...]], t0: float, t1: float) -> tuple[float, float, float, str]:
    """Over [t0, t1]: vLLM CPU s, engine-core CPU s, mean GPU busy, and the busiest engine-core thread's
    median / p90 share of a core ("-" where the samples have no such column)."""
    inside = [x for x in sampled if t0 <= x[0] <= t1]
    if len(inside) < 2:
        return float("nan"), float("nan"), float("nan"), "-"
    busy = sum(x[3] for x in inside) / len(inside)
    top = sorted(x[4] for x in inside[1:] if len(x) > 4)
    thread = f"{top[len(top) // 2]:.2f} / {top[min(len(top) - 1, len(top) * 9 // 10)]:.2f}" if top else "-"
    return inside[-1][1] - inside[0][1], inside[-1][2] - inside[0][2], busy, thread


def hits(mode: str, step: int) -> float | None:
    q = h = 0.0
    for f in (args.results / mode / "prefix_cache").glob("*.json"):
        c = json.loads(f.read_text()).get("steps", {}).get(str(step))
        if c:
            q, h = q + c["queries"], h + c["hits"]
    return round(h / q, 3) if q else None


tables = {
    m: {s: pq.read_table(E / m / "export" / "parquet" / f"step{s}.parquet").to_pylist() for s in (1, 2, 3)}
    for m in MODES
}
print(
    "| run | step | rows | items/s | sent | prefix hits | step-3 GPU busy | server CPU / item | engine core / item "
    "| engine core busy | busiest thread p50 / p90 |"
)
print("|---|---|---|---|---|---|---|---|---|---|---|")
for m in MODES:
    sampled = samples(m)
    for step in (1, 2, 3):
        rows = [r for r in tables[m][step] if r["status"] == "ok"]
        t0, t1 = window(rows)
        sent = sorted({f["sent"] or "single" for r in rows for f in r["forwards"]})
        extra = "| | | | | |"
        if step == 3:
            cpu, eng, busy, thread = over(sampled, t0, t1)
            extra = (
                f"| {busy:.0f} % | {1000 * cpu / len(rows):.0f} ms | {1000 * eng / len(rows):.0f} ms "
                f"| {eng / (t1 - t0):.2f} cores | {thread} |"
            )
        rate = len(rows) / (t1 - t0)
        print(f"| {m} | {step} | {len(rows)} | {rate:.1f} | {','.join(sent)} | {hits(m, step)} {extra}")
for m, step in [(m, step) for m in MODES[1:] for step in (1, 2, 3)]:
    base = {r["item_id"]: r for r in tables[MODES[0]][step] if r["status"] == "ok"}
    other = {r["item_id"]: r for r in tables[m][step] if r["status"] == "ok"}
    both = sorted(base.keys() & other.keys())
    same = sum([f["top"] for f in base[i]["forwards"]] == [f["top"] for f in other[i]["forwards"]] for i in both)
    pred = sum([f["pred"] for f in base[i]["forwards"]] == [f["pred"] for f in other[i]["forwards"]] for i in both)
    pairs = [(x, y) for i in both for fa, fb in zip(base[i]["forwards"], other[i]["forwards"], strict=True)
             for x, y in zip(fa["top"], fb["top"], strict=False)]  # fmt: skip
    drift = max((abs(x["logprob"] - y["logprob"]) for x, y in pairs if x["token"] == y["token"]), default=0.0)
    removed = sum(base[i]["removed"] == other[i]["removed"] for i in both)
    print(
        f"step {step}: {len(both)} items in {MODES[0]} and {m}, identical top-20 {same}, same preds {pred}, "
        f"same verdict {removed}, max |d logprob| over same tokens {drift:.2g}"
    )
