"""pool-sim: a vLLM-compatible server with a simulated Qwen3-VL model (no GPU needed)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from aiohttp import web

from ..cli import Parser, number
from ..protocol import BATCH_PATH
from .dialects import BATCH_SINCE, NEWEST, dialect
from .faults import FaultPlan, parse_rates, parse_schedule
from .model import PROFILES, profile_of
from .server import SimConfig, SimServer


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="pool-sim", description=__doc__)
    p.add_argument("--profile", choices=sorted(PROFILES), default="qwen3-vl-8b")
    p.add_argument("--model", help="a hub model id: the profile simulating it (pool-launch passes the protocol's)")
    p.add_argument("--served-model-name", help="default: the profile's hub id")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=number(int, 0, high=65535), default=8001)
    p.add_argument("--max-num-seqs", type=number(int, 1), default=64)
    p.add_argument("--max-logprobs", type=number(int, 0), default=20)
    p.add_argument("--limit-images", type=number(int, 0), default=32, help="as --limit-mm-per-prompt '{\"image\": N}'")
    p.add_argument("--limit-mm-per-prompt", type=json.loads, help='vLLM\'s form, e.g. \'{"image": 32, "video": 0}\'')
    p.add_argument("--max-model-len", type=number(int, 1))
    p.add_argument("--api-key", help="require this bearer key on /v1/* (env VLLM_API_KEY also works)")
    p.add_argument("--warmup-s", type=number(float, 0.0), default=0.0, help="/health answers 503 for this long")
    p.add_argument("--startup-delay-s", type=number(float, 0.0), default=0.0, help="do not even listen for this long")
    p.add_argument("--zero-latency", action="store_true", help="answer at once (client-overhead benchmarks)")
    p.add_argument(
        "--prefix-cache-tokens",
        type=number(int, 0),
        default=1_000_000,
        help="prompt tokens the simulated prefix cache holds",
    )
    p.add_argument(
        "--mm-processor-cache-gb",
        type=number(float, 0.0),
        default=4.0,
        help="vLLM's processor cache of processed images by uuid or content (0 = off); a 448x252 frame takes 1.4 MB",
    )
    p.add_argument(
        "--speed",
        type=number(float, 0.0, above=True),
        default=1.0,
        help="run the capacity model this many times faster",
    )
    p.add_argument("--old-errors", action="store_true", help="flat error bodies, as vLLM before 0.10.1")
    p.add_argument("--vllm", default=NEWEST, help=f"answer as this vLLM release does (tested: 0.11.0, {NEWEST})")
    p.add_argument("--faults", default="", help="rates, e.g. '500:0.01,hang:0.002,reset:0.01'")
    p.add_argument("--fault-schedule", default="", help="request numbers, e.g. '5:503,10-12:reset'")
    p.add_argument("--fault-seed", type=int, default=0)
    p.add_argument("--hang-s", type=number(float, 0.0), default=3600.0)
    p.add_argument("--exit-after", type=number(int, 1), help="crash (exit 3) when this request arrives")
    p.add_argument("--engine-dead", action="store_true", help="/health 503 and every request 503")
    p.add_argument("--log", type=Path, help="log file (default: stderr)")
    return p


def options(argv: list[str]) -> str:
    """What a simulator started with these arguments serves, read by its own parser, so pool-launch reports the
    simulator's options rather than a vLLM's: the release it answers as, the batch endpoint, its processor cache."""
    args, _ = build_parser().parse_known_args(argv)
    d = dialect(args.vllm)
    batch = f"serves {BATCH_PATH}" if d.batch else f"no {BATCH_PATH} (vLLM {BATCH_SINCE} and later)"
    return f"answers as vLLM {args.vllm}, {batch}, processor cache {args.mm_processor_cache_gb:g} GiB"


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(filename=args.log, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        prof = profile_of(args.model) if args.model else PROFILES[args.profile]
        rates, schedule = parse_rates(args.faults), parse_schedule(args.fault_schedule)
        faults = FaultPlan(seed=args.fault_seed, rates=rates, schedule=schedule)
        speaks = dialect(args.vllm)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from e
    cfg = SimConfig(
        profile=prof,
        served_name=args.served_model_name or prof.model,
        max_num_seqs=args.max_num_seqs,
        max_logprobs=args.max_logprobs,
        max_images=int(args.limit_mm_per_prompt.get("image", 0)) if args.limit_mm_per_prompt else args.limit_images,
        max_model_len=args.max_model_len,
        api_key=args.api_key or os.environ.get("VLLM_API_KEY") or None,
        warmup_s=args.warmup_s,
        zero_latency=args.zero_latency,
        speed=args.speed,
        prefix_cache_tokens=args.prefix_cache_tokens,
        mm_processor_cache_gb=args.mm_processor_cache_gb,
        old_errors=args.old_errors,
        dialect=speaks,
        exit_after=args.exit_after,
        hang_s=args.hang_s,
        faults=faults,
    )
    if args.startup_delay_s:
        time.sleep(args.startup_delay_s)
    server = SimServer(cfg)
    server.engine_dead = args.engine_dead
    logging.info(
        "pool-sim %s serving %s on %s:%d (max_num_seqs=%d, zero_latency=%s, faults=%s)",
        prof.name,
        cfg.served_name,
        args.host,
        args.port,
        cfg.max_num_seqs,
        cfg.zero_latency,
        args.faults or "none",
    )
    web.run_app(server.app(), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
