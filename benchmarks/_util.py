"""Small helpers the benchmark scripts share: CPU time of a process, table printing."""

from __future__ import annotations

import os


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def table(header: list[str], rows: list[list[object]]) -> str:
    cells = [header, *[[_fmt(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def _fmt(c: object) -> str:
    if isinstance(c, float):
        return f"{c:,.0f}" if abs(c) >= 1000 else f"{c:.3g}"
    return f"{c:,}" if isinstance(c, int) else str(c)
