"""pool-audit: check a results root before packing it; exit 1 with a list of problems.

Checks: every row parses and validates; no torn lines; one protocol fingerprint; every step-1 ok
row has the protocol's 4 orders; duplicate ok rows agree; step-2 rows only for step-1 survivors
with frames; step-3 rows only for step-2 survivors; rows only for known items; counts against the
plan (unfinished steps are warnings, or problems with --complete); survivors that steps 2-3 never
screened because their video is not `k:` and the frame cache is absent, empty or short of its
manifest (a warning, or a problem with --complete unless --allow-missing-frames).
"""

from __future__ import annotations

import sys

from ..cli import fail, load_protocol, parser, reports_errors, settings
from ..inputs.items import load_items
from ..observe.audit import Audit, Finding, run_audit
from ..settings import Settings
from .enqueue import add_allow_missing_frames


def _lines(tag: str, found: list[Finding]) -> list[str]:
    out = []
    for f in found:
        ex = f" (e.g. {', '.join(f.examples)})" if f.examples else ""
        out.append(f"{tag} [{f.check}] {f.detail}{ex}")
    return out


def summary(a: Audit) -> str:
    lines = _lines("PROBLEM", a.problems) + _lines("warning", a.warnings)
    verdict = f"{len(a.problems)} problem(s)" if a.problems else "OK"
    lines.append(f"audit: {a.rows:,} rows in {a.segments} segment(s): {verdict}, {len(a.warnings)} warning(s)")
    return "\n".join(lines)


def audit_results(s: Settings, complete: bool = False) -> Audit:
    """The audit of the results root the settings name (exits with the reason when there is none)."""
    if not s.results_dir.is_dir():
        what = "is a file, not a folder" if s.results_dir.exists() else "does not exist"
        fail(f"results folder {s.results_dir} ({s.results_named()}) {what}")
    items = load_items(s.items_dir)
    return run_audit(s.results_dir, load_protocol(s), items, s.frames_dir, complete=complete,
                     tar_dir=s.frames_tar_dir, allow_missing_frames=s.allow_missing_frames)  # fmt: skip


@reports_errors
def main(argv: list[str] | None = None) -> None:
    p = parser("pool-audit", __doc__ or "")
    p.add_argument("--complete", action="store_true", help="an unfinished step is a problem, not a warning")
    add_allow_missing_frames(p)
    a = p.parse_args(argv)
    result = audit_results(settings(a, allow_missing_frames=a.allow_missing_frames or None), complete=a.complete)
    print(summary(result))
    sys.exit(1 if result.problems else 0)
