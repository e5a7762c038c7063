"""What happened in a screen, and whether to trust its removals: the numbers behind pool-report.

Everything is computed from the store's index (one winner per item and step) joined with the item
table, as column operations; the full rows are never read. `plots.py` draws from the same tables.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..inputs.items import ItemSet
from ..protocol import LETTERS, Protocol
from ..store.store import Store

EXTREME = 0.01  # a benchmark removing <= 1 % or >= 99 % of its items deserves a look
MIN_FLAG_ITEMS = 20  # ... when it has at least this many items in the step
MAX_ERROR_RATE = 0.001
BORDER = 0.1  # |margin - threshold| within this is a borderline call
EXAMPLES = 5
IDLE_GAP_S = 10.0  # no item of the step answered for longer than this: a pause, not work
# pool-launch names its workers `<host>-gpu<i>[-s<steps>][-w<k>]`, and each worker adds `.<host>.<random>`
LAUNCHED = re.compile(r"(?P<host>.+)-(?P<gpu>gpu\d+(?:-s[\d-]+)?)(?:-w\d+)?\.(?P=host)\.[0-9a-f]{6}")
UNIQUE_SUFFIX = re.compile(r"\.[0-9a-f]{6}$")


@dataclass(frozen=True)
class StepReport:
    step: int
    rows: pa.Table  # winners of items in the item table, with n_options
    done: int
    error_ids: list[str]
    wall_s: float  # busy time (`busy_s`), not first start to last finish
    per_gpu: list[tuple[str, str, int, float]]  # (GPU, its servers' URLs, items, busy seconds)

    @property
    def ok(self) -> pa.Table:
        return self.rows.filter(pc.equal(self.rows.column("status"), "ok"))

    @property
    def items_per_s(self) -> float | None:
        return working_rate(self.rows, self.wall_s)

    @property
    def n_removed(self) -> int:
        return _count(self.ok.column("removed"))

    @property
    def n_errors(self) -> int:
        return len(self.error_ids)


@dataclass(frozen=True)
class Flag:
    what: str
    detail: str


def _count(mask: pa.ChunkedArray | pa.Array) -> int:
    return int(pc.sum(pc.fill_null(mask, False)).as_py() or 0)


def step_rows(step: int, store: Store, items: ItemSet) -> pa.Table:
    """The step's winners of items in the item table, with n_options: the rows the report counts (pool-status
    takes its rate while working from the same rows, so the two agree)."""
    known = items.items.select(["item_id", "n_options"])
    return store.winners(step).join(known, "item_id", join_type="inner")


def working_rate(rows: pa.Table, busy: float | None = None) -> float | None:
    """Items per second while working: the rows over their busy time (`busy_s`, given when known); None
    before any row."""
    busy = busy_s(rows) if busy is None else busy
    return rows.num_rows / busy if busy else None


def step_report(step: int, store: Store, items: ItemSet) -> StepReport:
    rows = step_rows(step, store, items)
    final = store.settled(step)
    done = _count(pc.is_in(rows.column("item_id"), value_set=final))
    errs = rows.filter(pc.equal(rows.column("status"), "error")).sort_by("item_id")
    per_gpu = []
    if rows.num_rows:
        gpus = _gpus(store, step, rows)
        of_row = pa.array([gpus[s] for s in rows.column("segment").to_pylist()], pa.string())
        for gpu in sorted(set(gpus.values())):
            mine = rows.filter(pc.equal(of_row, gpu))
            servers = ", ".join(sorted(set(pc.fill_null(mine.column("server"), "?").to_pylist())))
            per_gpu.append((gpu, servers, mine.num_rows, busy_s(mine)))
    return StepReport(step, rows, done, errs.column("item_id").to_pylist(), busy_s(rows), per_gpu)


def busy_s(rows: pa.Table) -> float:
    """The seconds during which some item of these rows was being answered: the union of their
    [started_at, finished_at] spans, where a gap of at most IDLE_GAP_S still counts as work (a worker
    between two jobs) and a longer one does not (a stop and a resume, a server restart, a step waiting
    for the previous step's survivors). Items per second over this time are the rate while working,
    which first-start-to-last-finish would dilute by every pause."""
    if not rows.num_rows:
        return 0.0
    lo = rows.column("started_at").to_numpy()
    hi = rows.column("finished_at").to_numpy()
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], np.maximum.accumulate(hi[order])  # hi[i]: the latest finish among the first i + 1
    gaps = lo[1:] - hi[:-1]
    return float(max(0.0, hi[-1] - lo[0] - gaps[gaps > IDLE_GAP_S].sum()))


def _gpus(store: Store, step: int, w: pa.Table) -> dict[str, str]:
    """Segment -> the GPU its worker fed, as the user names it. Each segment is one worker's, so one row
    of each tells: a pool-launch worker is `<host> gpu<i>` whatever its port (a resume may serve the GPU
    on another) and its process number; another worker is its name without the random suffix
    (`--name`, or its server's host-port), on its host."""
    t = w.select(["segment", "offset", "length"]).sort_by([("segment", "ascending"), ("offset", "ascending")])
    seg = t.column("segment").combine_chunks()
    first = np.ones(len(seg), dtype=bool)
    first[1:] = pc.not_equal(seg.slice(1), seg.slice(0, len(seg) - 1)).to_numpy(zero_copy_only=False)
    t = t.filter(pa.array(first))
    out = {}
    for segment, row in zip(t.column("segment").to_pylist(), store.read_rows(step, t), strict=True):
        name = str(row.get("worker") or row.get("server") or "?")
        m = LAUNCHED.fullmatch(name)
        out[segment] = f"{m['host']} {m['gpu']}" if m else UNIQUE_SUFFIX.sub("", name)
    return out


def by_benchmark(rep: StepReport) -> list[tuple[str, int, int, dict[int, int]]]:
    """(benchmark, ok items, removed, option-count mix) per benchmark of the step."""
    ok = rep.ok
    if not ok.num_rows:
        return []
    ok = _with_removed(ok)
    g = ok.group_by("benchmark").aggregate([("item_id", "count"), ("_rm", "sum")])
    mix = ok.group_by(["benchmark", "n_options"]).aggregate([("item_id", "count")])
    mixes: dict[str, dict[int, int]] = {}
    for b, n, c in zip(*(mix.column(x).to_pylist() for x in ("benchmark", "n_options", "item_id_count")), strict=True):
        mixes.setdefault(b, {})[n] = c
    rows = zip(*(g.column(x).to_pylist() for x in ("benchmark", "item_id_count", "_rm_sum")), strict=True)
    return sorted((b, n, r, dict(sorted(mixes[b].items()))) for b, n, r in rows)


def flags(reps: dict[int, StepReport], protocol: Protocol) -> list[Flag]:
    out = []
    for step, rep in reps.items():
        benches = [(b, n, r) for b, n, r, _ in by_benchmark(rep) if n >= MIN_FLAG_ITEMS]
        out += _extremes(step, [x for x in benches if x[2] / x[1] <= EXTREME], low=True)
        out += _extremes(step, [x for x in benches if x[2] / x[1] >= 1 - EXTREME], low=False)
        total = rep.rows.num_rows
        if total and rep.n_errors / total > MAX_ERROR_RATE:
            out.append(
                Flag(
                    f"step {step}: error rate {100 * rep.n_errors / total:.2f} % (> {100 * MAX_ERROR_RATE:.1f} %)",
                    f"{rep.n_errors} error rows, e.g. {', '.join(rep.error_ids[:EXAMPLES])}; check the vLLM log",
                )
            )
    for step, rep in reps.items():
        want = protocol.steps[step].n_orders
        bad = rep.ok.filter(pc.not_equal(pc.fill_null(rep.ok.column("n_perm"), 0), want))
        if bad.num_rows:
            ids = ", ".join(bad.column("item_id").to_pylist()[:EXAMPLES])
            out.append(Flag(f"step {step}: {bad.num_rows} ok rows without {want} orders", f"e.g. {ids}"))
    return out


def _extremes(step: int, benches: list[tuple[str, int, int]], low: bool) -> list[Flag]:
    """One flag for the benchmarks of a step that remove ~0 % (`low`) or ~100 %: the benchmark itself when it
    is one, else their count and the most extreme EXAMPLES (a screen that removes nothing, e.g. with dummy
    weights, is one line per step, not one per benchmark)."""
    if not benches:
        return []

    def say(b: str, n: int, r: int) -> str:
        return f"{b} {100 * r / n:.1f} % ({r} of {n} items)"

    if len(benches) == 1:
        b, n, r = benches[0]
        return [Flag(f"step {step}: {b} removes {100 * r / n:.1f} %", f"{r} of {n} items")]
    worst = sorted(benches, key=lambda x: ((1 if low else -1) * x[2] / x[1], -x[1], x[0]))
    more = len(worst) - EXAMPLES
    shown = ", ".join(say(*x) for x in worst[:EXAMPLES]) + (f", and {more} more" if more > 0 else "")
    bound = f"<= {100 * EXTREME:g} %" if low else f">= {100 * (1 - EXTREME):g} %"
    return [Flag(f"step {step}: {len(benches)} benchmarks remove {bound} of their items", f"most extreme: {shown}")]


def chance_floor(protocol: Protocol, option_counts: list[int]) -> list[tuple[int, int, float]]:
    """Per option count: the most orders a fixed-letter guesser gets right, and the chance that a
    uniform random guesser reaches the step-1 hit threshold (an upper bound on chance removals,
    since removal also needs the mean margin above the threshold)."""
    spec = protocol.steps[1]
    out = []
    for n in option_counts:
        best = 0
        for gold in range(n):
            shown = [protocol.order("chance", n, k).index(gold) for k in range(spec.n_orders)]
            best = max(best, max(shown.count(j) for j in range(n)))
        p = 1 / n
        k = spec.n_orders
        prob = sum(math.comb(k, h) * p**h * (1 - p) ** (k - h) for h in range(spec.min_hits, k + 1))
        out.append((n, best, prob))
    return out


def hits_table(rep: StepReport) -> dict[int, tuple[int, int]]:
    """Step 1: n_hits -> (items, removed)."""
    return _grouped(rep.ok, "n_hits")


def by_options(rep: StepReport) -> dict[int, tuple[int, int]]:
    """Option count -> (ok items, removed)."""
    return _grouped(rep.ok, "n_options")


def _grouped(ok: pa.Table, key: str) -> dict[int, tuple[int, int]]:
    g = _with_removed(ok).group_by(key).aggregate([("item_id", "count"), ("_rm", "sum")])
    cols = (g.column(c).to_pylist() for c in (key, "item_id_count", "_rm_sum"))
    return dict(sorted((k or 0, (n, r)) for k, n, r in zip(*cols, strict=True)))


def _with_removed(ok: pa.Table) -> pa.Table:
    return ok.append_column("_rm", pc.cast(pc.fill_null(ok.column("removed"), False), pa.int64()))


def borderline(rep: StepReport, threshold: float) -> tuple[int, int]:
    """(ok items with |margin - threshold| <= BORDER, of those removed)."""
    ok = rep.ok
    near = pc.less_equal(pc.abs(pc.subtract(ok.column("margin"), threshold)), BORDER)
    return _count(near), _count(pc.and_(near, pc.fill_null(ok.column("removed"), False)))


def letters(rep: StepReport) -> dict[str, int]:
    """Picked letter -> items (steps 2-3: the shown letter; step 1: order 0's, as an original letter)."""
    ok = rep.ok
    if not ok.num_rows:
        return {}
    vc = pc.value_counts(pc.drop_null(ok.column("pred")))
    got = dict(zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist(), strict=True))
    return {k: got[k] for k in LETTERS if k in got}


def all_steps(store: Store, items: ItemSet, protocol: Protocol) -> dict[int, StepReport]:
    return {s: step_report(s, store, items) for s in sorted(protocol.steps)}
