"""The worker process: jobs from RQ -> items -> forwards to one vLLM server -> rows on disk -> ack."""

__all__ = [
    "client",  # VLLMClient: forwards with retries, outages waited out
    "main",  # pool-worker
    "metrics",  # Prometheus metrics of one worker
    "redis_link",  # every Redis call, with outages waited out
    "runtime",  # the job loop
    "screen",  # one item through one step
    "serving",  # which steps a server's model serves
    "transport",  # httpx requests over aiohttp
]
