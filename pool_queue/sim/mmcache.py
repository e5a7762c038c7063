"""vLLM's multimodal processor cache, as one API server holds it (`--mm-processor-cache-gb`).

vLLM keys each processed image by its `mm_hash`: the part's `uuid` where the request gives one, else a hash of
the image's content. A cached image is not processed again, and a part that names a cached uuid may leave its
data out. The cache is private to its process (so a restarted server starts empty) and drops its least
recently used items when a new one would not fit; 0 GiB turns it off, as in vLLM.
"""

from __future__ import annotations

from collections import OrderedDict

GIB = 1024**3
# A processed Qwen3-VL image as the cache holds it: 4 patches of 3x2x16x16 values per token at 2 bytes
# (32 frames of 448x252 are ~44 MB, as measured on vLLM 0.26).
BYTES_PER_TOKEN = 4 * 1536 * 2


class ProcessorCache:
    """Image tokens by mm_hash, least recently used first; `queries` and `hits` count lookups by item, as
    vLLM's `vllm:mm_cache_queries` and `vllm:mm_cache_hits` do."""

    def __init__(self, gib: float) -> None:
        self.capacity = int(gib * GIB)
        self._items: OrderedDict[str, int] = OrderedDict()
        self._bytes = 0
        self.queries = 0
        self.hits = 0

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def get(self, key: str) -> int | None:
        """The cached image's tokens, now most recently used; None on a miss (or with the cache off)."""
        if not self.enabled:
            return None
        self.queries += 1
        tokens = self._items.get(key)
        if tokens is not None:
            self.hits += 1
            self._items.move_to_end(key)
        return tokens

    def put(self, key: str, tokens: int) -> None:
        size = tokens * BYTES_PER_TOKEN
        if not self.enabled or size > self.capacity or key in self._items:
            return
        self._items[key] = tokens
        self._bytes += size
        while self._bytes > self.capacity:
            self._bytes -= self._items.popitem(last=False)[1] * BYTES_PER_TOKEN

    def clear(self) -> None:
        self._items.clear()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)
