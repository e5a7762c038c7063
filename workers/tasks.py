"""The function RQ jobs name. `pool-worker` runs chunks itself (several at once, over asyncio);
a plain `rq worker` must not take them, since it would run one chunk at a time with no server
binding, so this refuses with instructions instead of doing the work badly."""

from __future__ import annotations


def screen_chunk(step: int, item_ids: list[str]) -> None:
    raise RuntimeError(
        f"step-{step} chunk of {len(item_ids)} items was taken by a plain `rq worker`; run `pool-worker --server URL` "
        "instead (it binds to a vLLM server and keeps many forwards in flight)"
    )
