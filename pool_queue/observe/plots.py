"""The report's figures, drawn with matplotlib's Figure API (no pyplot state, no display needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from .report import StepReport, by_benchmark, letters

COLORS = {1: "#1f77b4", 2: "#ff7f0e", 3: "#2ca02c"}
NAMES = {1: "step 1 (blind)", 2: "step 2 (1 frame)", 3: "step 3 (32 frames)"}


def removal_by_benchmark(reps: dict[int, StepReport], path: Path) -> None:
    """One row per benchmark (sorted by step-1 rate), one marker per step: readable at 139 rows."""
    rates = {s: {b: r / n for b, n, r, _ in by_benchmark(rep)} for s, rep in reps.items()}
    benches = sorted(set().union(*rates.values()), key=lambda b: (rates.get(1, {}).get(b, -1), b))
    fig = Figure(figsize=(9, max(3.0, 0.6 + 0.2 * len(benches))))
    ax = fig.subplots()
    y = np.arange(len(benches))
    for step, by_bench in rates.items():
        xs = [100 * by_bench[b] if b in by_bench else np.nan for b in benches]
        ax.scatter(xs, y, s=22, color=COLORS[step], label=NAMES[step], zorder=3)
    ax.set_yticks(y, benches, fontsize=7 if len(benches) > 40 else 9)
    ax.set_ylim(-0.7, len(benches) - 0.3)
    ax.set_xlim(-2, 102)
    ax.set_xlabel("items removed (% of the step's items of that benchmark)")
    ax.grid(axis="x", alpha=0.4)
    ax.grid(axis="y", alpha=0.15)
    ax.set_title("Removal rate by benchmark", pad=24)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def margins(reps: dict[int, StepReport], threshold: float, path: Path) -> None:
    """Per step, the margin histogram split into removed and kept, with the threshold marked."""
    fig = Figure(figsize=(4.2 * len(reps), 3.4))
    axes = fig.subplots(1, len(reps), squeeze=False)
    for ax, (step, rep) in zip(axes[0], reps.items(), strict=True):
        ok = rep.ok
        m = np.asarray(ok.column("margin").to_numpy(zero_copy_only=False), dtype=float)
        rm = np.asarray(ok.column("removed").fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
        if len(m):
            lo, hi = np.percentile(m, [0.5, 99.5])
            lo, hi = min(lo, threshold - 1), max(hi, threshold + 1)
            bins = np.linspace(lo, hi, 50)
            ax.hist(
                [np.clip(m[~rm], lo, hi), np.clip(m[rm], lo, hi)],
                bins=bins,
                stacked=True,
                color=["#999999", COLORS[step]],
                label=["kept", "removed"],
            )
            ax.legend(fontsize=8)
        ax.axvline(threshold, color="k", ls="--", lw=1)
        ax.text(threshold, ax.get_ylim()[1] * 0.95, " ln 2", fontsize=8, va="top")
        ax.set_title(f"{NAMES[step]}: {len(m):,} items", fontsize=10)
        ax.set_xlabel("mean margin over orders" if step == 1 else "margin (gold - best other)")
        ax.set_ylabel("items")
    fig.suptitle("Margin distributions")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def picked_letters(reps: dict[int, StepReport], path: Path) -> None:
    """Share of each picked letter per step: a strong position bias shows as one tall bar."""
    counts = {s: letters(rep) for s, rep in reps.items()}
    keys = sorted(set().union(*counts.values()))
    fig = Figure(figsize=(max(5.0, 0.6 * len(keys) + 2), 3.4))
    ax = fig.subplots()
    width = 0.8 / max(1, len(counts))
    x = np.arange(len(keys))
    for i, (step, counted) in enumerate(counts.items()):
        total = sum(counted.values()) or 1
        ax.bar(
            x + i * width, [100 * counted.get(k, 0) / total for k in keys], width, color=COLORS[step], label=NAMES[step]
        )
    ax.set_xticks(x + width * (len(counts) - 1) / 2, keys)
    ax.set_ylabel("% of the step's items")
    ax.set_xlabel("letter picked")
    ax.set_title("Picked letters")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
