"""The protocol computed directly on the simulated model, with no queue, worker or store: the
reference that end-to-end and chaos runs are held to (removed and margin per item and step)."""

from __future__ import annotations

from pathlib import Path

from pool_queue.inputs.items import load_items
from pool_queue.protocol import Protocol
from pool_queue.sim.model import PROFILES, answer

P = Protocol()


def expected(root: Path) -> dict[int, dict[str, tuple[bool, float]]]:
    """step -> item -> (removed, margin), for every item each step reaches."""
    items = load_items(root / "items").items
    frames = root / "frames" / "pool_frames"
    with_frames = {p.name for p in frames.iterdir() if p.is_dir()}
    out: dict[int, dict[str, tuple[bool, float]]] = {1: {}, 2: {}, 3: {}}
    for it in items.to_pylist():
        alive = True
        for step, prof in ((1, "qwen3-vl-8b"), (2, "qwen3-vl-8b"), (3, "qwen3-vl-2b")):
            if not alive or (step == 2 and it["video_id"] not in with_frames):
                break
            n_img = 0
            if step > 1:
                n = sum(1 for p in (frames / it["video_id"]).iterdir() if p.suffix in (".jpg", ".png"))
                n_img = len(P.frame_indices(step, n))
            fws = []
            orders = P.orders(step, it["item_id"], it["n_options"])
            for order in orders:
                text = P.prompt_text(it["question"], [it["options"][i] for i in order])
                fws.append(
                    P.judge_forward(answer(PROFILES[prof], text, n_img, 20), it["n_options"], order.index(it["gold"]))
                )
            v = P.judge_item(step, orders, fws)
            out[step][it["item_id"]] = (v.removed, v.margin)
            alive = not v.removed
    return out
