"""pool-worker: screen items from the RQ queues through one vLLM server (one per GPU; several may share one)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys
from urllib.parse import urlsplit

import redis

from pool_queue.cli import fail, load_protocol, number, parser, reports_errors
from pool_queue.cli import settings as cli_settings
from pool_queue.errors import ServerMisconfigured
from pool_queue.inputs.items import ItemSet, load_items
from pool_queue.jobs.lease import Timing
from pool_queue.jobs.queue import screen_of
from pool_queue.launch.sizing import FALLBACK_SEQS
from pool_queue.protocol import Protocol
from pool_queue.settings import BURST_WAIT_S, Settings
from pool_queue.store.store import Store

from .client import VLLMClient
from .config import WorkerConfig
from .runtime import Worker, unique_name
from .serving import served_steps
from .waiting import Stop, Stopped

log = logging.getLogger(__name__)


def bad_server_url(url: str) -> str | None:
    """Why `url` cannot be a vLLM base URL (no wait would help), or None."""
    u = urlsplit(url)
    try:
        port = u.port
    except ValueError:
        return f"--server {url}: bad port"
    if u.scheme not in ("http", "https") or not u.hostname or port == 0:
        return f"--server {url}: write the vLLM base URL as http://HOST:PORT"
    if u.path.strip("/"):  # the client adds /health and /v1/...: a path here finds neither
        return f"--server {url}: pass the server's base URL without a path: {u.scheme}://{u.netloc}"
    return None


def check_redis(settings: Settings) -> None:
    """One quick PING before any wait: a refused password is named now (cli.reports_errors, exit 2), not
    after the wait for the server, and so is the Redis of a stopped demo that a `.env` names (it went with the
    demo: no wait helps); any other Redis that does not answer yet is waited for later, as an outage."""
    conn = redis.Redis.from_url(
        settings.redis_url, socket_connect_timeout=1, socket_timeout=1, **settings.redis_kwargs()
    )
    try:
        conn.ping()
    except redis.AuthenticationError:
        raise
    except redis.RedisError:
        if (gone := settings.demo_gone()) is not None:
            fail(gone)
    finally:
        conn.close()


def _parser() -> argparse.ArgumentParser:
    p = parser("pool-worker", __doc__ or "")
    p.add_argument("--server", help="vLLM base URL, e.g. http://127.0.0.1:8001 (default: first of POOL_SERVERS)")
    p.add_argument(
        "--name", help="name prefix in `rq info` (default: the server's host-port); host and a random suffix follow"
    )
    p.add_argument("--steps", help="comma-separated steps to take (default: every step the server's model serves)")
    p.add_argument(
        "--inflight", type=number(int, 1), help="forwards in flight to the server (default WORKERS, else MAX_SEQS)"
    )
    p.add_argument("--burst", action="store_true", help="exit when the queues are empty (waits at most 30 s)")
    p.add_argument(
        "--wait-server",
        dest="wait_server_s",
        type=number(float, 0.0),
        metavar="S",
        help="wait this long for the server at start (1 h)",
    )
    p.add_argument(
        "--wait-redis",
        dest="wait_redis_s",
        type=number(float, 0.0),
        metavar="S",
        help="wait this long for Redis, at start or mid-run (1 h)",
    )
    p.add_argument(
        "--metrics-port",
        type=number(int, 0, high=65535),
        help="serve Prometheus /metrics on this port (0: any free port; POOL_METRICS_PORT)",
    )
    p.add_argument("--allow-unpinned", action="store_true", help="accept a server whose root shows no revision")
    p.add_argument("--log-level", default="INFO")
    return p


async def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("rq.job").setLevel(logging.WARNING)  # "enqueued for retry" per job: the rescue says it once
    settings = cli_settings(args, wait_server_s=args.wait_server_s, wait_redis_s=args.wait_redis_s)
    server = args.server or (settings.servers[0] if settings.servers else None)
    if not server:
        fail("no server: pass --server URL or set POOL_SERVERS")
    if (why := bad_server_url(server)) is not None:
        fail(why)
    # waiting suits a long-running worker, not a one-off run
    waits_s = (settings.wait_server_s, settings.wait_redis_s)
    wait_server_s, wait_redis_s = (min(wait_s, BURST_WAIT_S) if args.burst else wait_s for wait_s in waits_s)
    protocol = load_protocol(settings)
    # the inputs and the password first: a wrong root or password fails at once, before any wait or write
    items = load_items(settings.items_dir, settings.root_named())
    store = Store(
        settings.results_dir, protocol.fingerprint, protocol.model_dump(mode="json"), settings.results_named()
    )
    store.check_stamp()
    check_redis(settings)
    stop = Stop()
    stop.install()  # from here every wait ends on the first signal
    key = settings.vllm_api_key.get_secret_value() if settings.vllm_api_key else None
    async with VLLMClient(
        server,
        key,
        settings.request_timeout_s,
        settings.max_attempts,
        backoff_s=settings.retry_backoff_s,
        note_s=settings.wait_note_s,
    ) as client:
        log.info("waiting up to %.0f s for the vLLM server at %s (/health)", wait_server_s, server)
        try:
            await client.wait_first(wait_server_s, stop)
        except Stopped:
            log.info("stopped while waiting for the vLLM server at %s", server)
            return 0
        steps = served_steps(protocol, await client.served_models(), args.allow_unpinned)
        if args.steps:
            wanted = [int(x) for x in args.steps.split(",")]
            if not set(wanted) <= set(steps):
                raise ServerMisconfigured(f"--steps {args.steps}: the server serves steps {steps} only")
            steps = wanted
        store.claim()
        w = _worker(args, settings, protocol, items, store, client, server, steps, wait_redis_s, stop)
        w.screener.batch = settings.batch == "auto" and await client.batch_endpoint()
        log.info(
            "%s: %s", w.config.name, "batch requests (the server lists /v1/chat/completions/batch): a video's items "
            "together, siblings' frames by uuid" if w.screener.batch else "one request per forward "
            f"(batch={settings.batch}, or the server's /openapi.json lists no /v1/chat/completions/batch)",
        )  # fmt: skip
        gc.collect()
        gc.freeze()  # start-up objects (the item table's Python side, modules) leave the collector's scans
        return await w.run()


def worker_config(
    args: argparse.Namespace, settings: Settings, server: str, steps: list[int], wait_redis_s: float
) -> WorkerConfig:
    """The worker's configuration: the settings, with the command's flags over them (a fresh unique name)."""
    return WorkerConfig(
        name=unique_name(server, args.name),
        server=server,
        steps=tuple(steps),
        # pool-launch passes the derived size
        max_inflight=args.inflight or settings.workers or settings.max_seqs_for(tuple(steps)) or FALLBACK_SEQS,
        frames_dir=settings.frames_dir,
        redis=settings.redis_said(),
        wait_redis_s=wait_redis_s,
        timing=Timing(settings.lease_s, settings.heartbeat_s, settings.rescue_s, settings.job_max_failures),
        silent_s=settings.silent_bound_s,
        burst=args.burst,
        note_s=settings.wait_note_s,
        metrics_port=args.metrics_port if args.metrics_port is not None else settings.metrics_port,
        max_frame_pixels=settings.max_frame_pixels,
        video_send=settings.video_send,
    )


def _worker(
    args: argparse.Namespace,
    settings: Settings,
    protocol: Protocol,
    items: ItemSet,
    store: Store,
    client: VLLMClient,
    server: str,
    steps: list[int],
    wait_redis_s: float,
    stop: Stop,
) -> Worker:
    screen = screen_of(store, settings.redis())
    assert screen is not None  # the store was just claimed
    config = worker_config(args, settings, server, steps, wait_redis_s)
    stop.who = config.name
    log.info(
        "%s: screen %s, steps %s via %s, %d in flight, %d items known",
        config.name, screen.id, steps, server, config.max_inflight, items.items.num_rows,
    )  # fmt: skip
    return Worker(config, protocol=protocol, items=items, store=store, screen=screen, client=client, stop=stop)


@reports_errors
def main(argv: list[str] | None = None) -> None:
    raise SystemExit(asyncio.run(_main(argv)))


if __name__ == "__main__":
    main()
