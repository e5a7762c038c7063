"""Which protocol steps a server may take: its /v1/models must show the step's model at the pinned revision."""

from __future__ import annotations

from typing import Any

from pool_queue.errors import ServerMisconfigured
from pool_queue.protocol import Protocol


def _pinned(root: str, revision: str) -> bool:
    """vLLM reports the model's root: a snapshot path (…/snapshots/<rev>) or `<id>@<rev>` shows the revision."""
    root = root.rstrip("/")
    return root.endswith(f"/snapshots/{revision}") or root.endswith(f"@{revision}") or root.endswith(f"/{revision}")


def served_steps(protocol: Protocol, models: list[dict[str, Any]], allow_unpinned: bool = False) -> list[int]:
    """Steps whose model the server serves; raise with a clear message on a mismatch."""
    by_name = {str(m.get("id")): str(m.get("root") or "") for m in models}
    steps, problems = [], []
    for step, spec in protocol.steps.items():
        root = by_name.get(spec.served_name)
        if root is None:
            continue
        if _pinned(root, spec.revision) or (allow_unpinned and root in (spec.model, spec.served_name)):
            steps.append(step)
        else:
            problems.append(
                f"step {step} needs {spec.model} at revision {spec.revision}, the server's root is {root!r}"
            )
    if problems:
        raise ServerMisconfigured("; ".join(problems) + " (serve the pinned snapshot, as pool-launch does)")
    if not steps:
        want = sorted({spec.served_name for spec in protocol.steps.values()})
        raise ServerMisconfigured(f"the server serves {sorted(by_name)}, none of the protocol's models {want}")
    return sorted(steps)
