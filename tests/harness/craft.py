"""Hand-made result rows for report and audit tests: shaped like the worker's, values chosen by the test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pool_queue.inputs.items import load_items
from pool_queue.protocol import LETTERS, Protocol
from pool_queue.rows import ForwardRecord, Row
from pool_queue.store.store import Store

P = Protocol()


def row(
    item: dict[str, Any],
    step: int,
    *,
    removed: bool = False,
    status: str = "ok",
    n_orders: int | None = None,
    benchmark: str | None = None,
    fingerprint: str | None = None,
    pred: str | None = None,
    margin: float | None = None,
    t: float = 1000.0,
) -> dict[str, Any]:
    n = item["n_options"]
    orders = P.orders(step, item["item_id"], n)[: n_orders or P.steps[step].n_orders]
    m = margin if margin is not None else (2.0 if removed else -1.0)

    def picked(o: list[int]) -> str:
        g = o.index(item["gold"])
        return LETTERS[g] if removed else LETTERS[(g + 1) % n]

    fws = [
        ForwardRecord(
            order=o,
            gold=LETTERS[o.index(item["gold"])],
            logprobs={LETTERS[j]: -1.0 for j in range(n)},
            floored=[],
            pred=picked(o),
            margin=m,
            hit=removed,
            top=[("A", -0.5)],
        )
        for o in orders
    ]
    spec = P.steps[step]
    ok = status == "ok"
    return Row(
        item_id=item["item_id"],
        step=step,
        status="ok" if ok else "error",
        benchmark=benchmark or item["benchmark"],
        video_id=item["video_id"],
        error=None if ok else "HTTP 400: bad",
        error_kind=None if ok else "permanent",
        attempts=len(fws),
        removed=removed if ok else None,
        pred=(pred or fws[0].pred) if ok else None,
        margin=m if ok else None,
        n_hits=sum(f.hit for f in fws) if ok else None,
        n_perm=len(fws) if ok else None,
        forwards=fws if ok else [],
        fingerprint=fingerprint or P.fingerprint,
        model=spec.model,
        revision=spec.revision,
        server="http://gpu0:8001",
        worker="w0",
        started_at=t,
        finished_at=t + 1,
    ).model_dump(mode="json")


def items_of(root: Path) -> list[dict[str, Any]]:
    return load_items(root / "items").items.to_pylist()


def write(root: Path, step: int, rows: list[dict[str, Any]], name: str = "craft") -> Path:
    store = Store(root / "results" / "pool", P.fingerprint, P.model_dump(mode="json"))
    w = store.writer(step, name)
    w.write(rows)
    w.close()
    return w.path


def valid_store(root: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Step 1 for every item (every other one removed); step 2 for the first survivors with frames."""
    items = items_of(root)
    write(root, 1, [row(it, 1, removed=i % 2 == 0) for i, it in enumerate(items)])
    with_frames = {p.name for p in (root / "frames" / "pool_frames").iterdir()}
    alive = [it for i, it in enumerate(items) if i % 2 and it["video_id"] in with_frames]
    write(root, 2, [row(it, 2, removed=True) for it in alive[:10]])
    return items, alive
