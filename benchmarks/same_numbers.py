"""Do two servers compute the same numbers? The same requests, one at a time, to both.

A server option that only changes where or how fast work runs (tensor IPC, renderer threads,
encoder CUDA graphs) must leave every answer alone. Each request goes to A, then to B, alone (a
batch of one on both sides, so batching cannot explain a difference), for items neither has seen
(--skip those in a server's cache); the top-20 lists and the protocol's reading of them (predicted
letter, margin) are compared.
Usage: python benchmarks/same_numbers.py --step 3 --a http://127.0.0.1:8002 --b http://127.0.0.1:8003 [--n 16]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from _pool import P, bodies, pool_items
from _util import table

from workers.client import parse_answer


def ask(c: httpx.Client, url: str, body: bytes) -> list[tuple[str, float]]:
    r = c.post(f"{url}/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    r.raise_for_status()
    return parse_answer(r.content)[0]


def compare(step: int, a: str, b: str, root: Path, n: int, skip: int = 0) -> dict[str, float]:
    items = pool_items(root, step, skip + n)[skip : skip + n]
    identical = same_set = same_pred = 0
    max_d = max_margin_d = 0.0
    with httpx.Client(timeout=300) as c:
        for it in items:
            n_opt = len(it["options"])
            body = bodies(root, step, [it])[0]  # its first option order
            gold = P.orders(step, it["item_id"], n_opt)[0].index(it["gold"])
            ta, tb = ask(c, a, body), ask(c, b, body)
            da, db = dict(ta), dict(tb)
            identical += ta == tb
            same_set += da.keys() == db.keys()
            max_d = max([max_d, *(abs(da[k] - db[k]) for k in da.keys() & db.keys())])
            fa, fb = P.judge_forward(ta, n_opt, gold), P.judge_forward(tb, n_opt, gold)
            same_pred += fa.pred == fb.pred
            max_margin_d = max(max_margin_d, abs(fa.margin - fb.margin))
    return {"requests": len(items), "identical top-20": identical, "same 20 tokens": same_set,
            "same pred": same_pred, "max |d logprob|": max_d, "max |d margin|": max_margin_d}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step", type=int, choices=(1, 2, 3), required=True)
    ap.add_argument("--a", required=True, help="the reference server's base URL")
    ap.add_argument("--b", required=True, help="the server under test")
    ap.add_argument("--n", type=int, default=16, help="requests (the first order of n items)")
    ap.add_argument("--skip", type=int, default=0, help="leave the pool's first N items out (in a server's cache)")
    ap.add_argument("--root", type=Path, help="package root (a synthetic pool is generated if absent)")
    args = ap.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="pool-same-")) / "root"
    res = compare(args.step, args.a, args.b, root, args.n, args.skip)
    print(f"step {args.step}: {args.b} against {args.a}")
    print(table(list(res), [list(res.values())]))


if __name__ == "__main__":
    main()
