"""The report's text and folder: the Markdown of pool-report (`markdown`) from the report's numbers
(`observe.report`), written with its PNG plots (`observe.plots`) into a report folder (`write_report`)."""

from __future__ import annotations

from pathlib import Path

from ..cli import output_dir
from ..inputs.items import ItemSet
from ..jobs.plan import frameless_notes
from ..proc.progress import busy_time
from ..protocol import Protocol
from ..store.store import Store
from ..text import printable
from . import plots, prefix_cache
from .report import (
    BORDER,
    EXAMPLES,
    IDLE_GAP_S,
    StepReport,
    all_steps,
    borderline,
    by_benchmark,
    by_options,
    chance_floor,
    flags,
    hits_table,
    letters,
)

PLOTS = ("removal_by_benchmark.png", "margins.png", "letters.png")


def _table(head: list[str], rows: list[list[object]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return [*out, ""]


def cell(value: object) -> str:
    """A value as one Markdown table cell or list line: a benchmark name or an id holding `|` or a line
    break cannot break the table or the list (escaped, and line breaks as spaces); text that is not
    UTF-8 is escaped too."""
    text = printable(str(value)).replace("\\", "\\\\").replace("|", "\\|")
    return " ".join(text.splitlines()) if "\n" in text or "\r" in text else text


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.1f} %" if b else "-"


def markdown(
    reps: dict[int, StepReport], items: ItemSet, protocol: Protocol, results: Path, notes: list[str] | None = None
) -> str:
    """The report's text; `notes` (e.g. survivors without frames, `plan.frameless_notes`) follow the return
    report's table."""
    t = protocol.margin_threshold
    md = ["# Pool screen report", "", f"Results: `{results}`  ", f"Protocol: `{protocol.fingerprint}`  "]
    md += [f"Items: {items.items.num_rows:,} valid, {items.rejected.num_rows:,} rejected at validation", ""]
    md += ["## Return report", ""]
    rows = []
    cache = prefix_cache.read(results)
    for step, rep in reps.items():
        ex = ", ".join(rep.error_ids[:EXAMPLES]) + (" ..." if rep.n_errors > EXAMPLES else "")
        rate = "-" if rep.items_per_s is None else f"{rep.items_per_s:.1f}"
        hit = cache[step].rate if step in cache else None
        hits = f"{100 * hit:.1f} %" if hit is not None else "-"
        counts = [f"{rep.done:,}", f"{rep.n_removed:,}", f"{rep.n_errors:,}"]
        rows.append([step, *counts, ex or "-", busy_time(rep.wall_s), rate, hits])
    head = ["step", "items done", "removed", "error rows", "example error ids", "wall", "items/s", "prefix-cache hits"]
    md += _table(head, rows)
    md += [
        f"Wall: the time the step's items were being answered (the union of their start-to-finish spans); a stretch "
        f"of more than {IDLE_GAP_S:g} s with none (a stop and a resume, a step waiting for the previous one's "
        "survivors) is left out, so items/s is the rate while working.  ",
        "Prefix-cache hits: vLLM's share of prompt tokens served from its cache (a video's items share frames).",
        "",
    ]
    md += [*(f"{n}  " for n in notes), ""] if notes else []
    rows = [
        [s, gpu, servers, f"{n:,}", busy_time(w), f"{n / w:.1f}" if w else "-"]
        for s, r in reps.items()
        for gpu, servers, n, w in r.per_gpu
    ]
    md += [
        "Per GPU (a pool-launch GPU by its host and index, whatever port a resume served it on; another worker by "
        "its name):",
        "",
        *_table(["step", "GPU", "servers", "items", "wall", "items/s"], rows),
    ]

    md += ["## Sanity flags", ""]
    found = flags(reps, protocol)
    md += [f"- **{cell(f.what)}**: {cell(f.detail)}" for f in found] or [  # a name may hold | or a break
        "None: no benchmark at ~0 % or ~100 %, every step-1 row has all orders, error rates below 0.1 %."
    ]
    md += [""]

    md += ["## Removal by benchmark", "", "![removal by benchmark](removal_by_benchmark.png)", ""]
    per = {s: {b: (n, rm, mix) for b, n, rm, mix in by_benchmark(r)} for s, r in reps.items()}
    head = ["benchmark", "options (n:items)"] + [f"step {s} removed" for s in reps]
    rows = []
    for b in sorted(per.get(1, {})):
        mix = " ".join(f"{k}:{v}" for k, v in per[1][b][2].items())
        cells = [
            f"{per[s][b][1]}/{per[s][b][0]} ({_pct(per[s][b][1], per[s][b][0])})" if b in per[s] else "-" for s in reps
        ]
        rows.append([b, mix, *cells])
    md += _table(head, rows)

    md += ["## Trust", "", "### Chance floor (step 1, cyclic orders)", ""]
    if 1 in reps:
        obs = by_options(reps[1])
        ns = sorted(obs)
        spec = protocol.steps[1]
        rows = [
            [
                n,
                f"{best}/{spec.n_orders}",
                f"{100 * p:.2f} %",
                f"{obs[n][1]:,}/{obs[n][0]:,} ({_pct(obs[n][1], obs[n][0])})",
            ]
            for n, best, p in chance_floor(protocol, ns)
        ]
        md += [
            f"A fixed-letter guesser can never reach {spec.min_hits}/{spec.n_orders}; a uniform random guesser "
            f"reaches it with the probability shown (an upper bound on removals by chance, since the mean margin "
            f"must also exceed ln 2).",
            "",
            *_table(["options", "fixed-letter best", "random guesser >= threshold", "observed removed"], rows),
            "### Orders right (step 1)",
            "",
        ]
        md += _table(
            ["orders right", "items", "removed"], [[h, f"{n:,}", f"{r:,}"] for h, (n, r) in hits_table(reps[1]).items()]
        )
    md += [f"### Borderline items (margin within {BORDER} of ln 2)", ""]
    rows = [
        [s, f"{b[0]:,}", f"{b[1]:,}", _pct(b[0], r.ok.num_rows)] for s, r in reps.items() for b in [borderline(r, t)]
    ]
    md += _table(["step", "borderline", "of those removed", "share of ok items"], rows)
    md += ["### Picked letters", "", "![picked letters](letters.png)", ""]
    lets = {s: letters(r) for s, r in reps.items()}
    keys = sorted(set().union(*lets.values()))
    md += _table(["step", *keys], [[s, *(f"{lets[s].get(k, 0):,}" for k in keys)] for s in reps])
    md += ["### Margins", "", "![margins](margins.png)", ""]
    return "\n".join(md) + "\n"


def write_report(store: Store, items: ItemSet, protocol: Protocol, out: Path, frames_dir: Path | None = None) -> Path:
    """The report folder; with the frame cache, the report counts the survivors that have no frames."""
    reps = all_steps(store, items, protocol)
    notes = frameless_notes(protocol, items.items, store, frames_dir) if frames_dir else []
    output_dir(out)
    plots.removal_by_benchmark(reps, out / PLOTS[0])
    plots.margins(reps, protocol.margin_threshold, out / PLOTS[1])
    plots.picked_letters(reps, out / PLOTS[2])
    path = out / "report.md"
    path.write_text(markdown(reps, items, protocol, store.root, notes), encoding="utf-8")
    return path
