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

from ..cli import add_allow_missing_frames, parser, reports_errors
from ..cli import settings as cli_settings
from ..observe.audit import audit_results, summary


@reports_errors
def main(argv: list[str] | None = None) -> None:
    p = parser("pool-audit", __doc__ or "")
    p.add_argument("--complete", action="store_true", help="an unfinished step is a problem, not a warning")
    add_allow_missing_frames(p)
    args = p.parse_args(argv)
    result = audit_results(
        cli_settings(args, allow_missing_frames=args.allow_missing_frames or None), complete=args.complete
    )
    print(summary(result))
    sys.exit(1 if result.problems else 0)
