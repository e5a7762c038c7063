"""Prometheus metrics of one worker, scraped next to its vLLM server's own /metrics.

A registry per worker (not the global one), so several workers in one test process or host never
share counters; names carry the `pool_` prefix, labels only the step and error kind (low cardinality).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from pool_queue.rows import Row

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self, inflight: Callable[[], float]) -> None:
        r = self.registry = CollectorRegistry()
        self.items = Counter("pool_items", "Items screened, by step and row status", ["step", "status"], registry=r)
        self.removed = Counter("pool_items_removed", "Items removed (answered without the video)", ["step"], registry=r)
        self.errors = Counter("pool_item_errors", "Error rows, by step and error kind", ["step", "kind"], registry=r)
        self.forwards = Counter("pool_forwards", "Forwards answered by the server", ["step"], registry=r)
        self.retries = Counter(
            "pool_forward_retries", "Forward attempts repeated after a transient failure", registry=r
        )
        self.jobs = Counter("pool_jobs", "RQ jobs acknowledged (rows on disk)", registry=r)
        self.latency = Histogram(
            "pool_forward_latency_seconds",
            "Forward latency seen by the worker",
            ["step"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        g = Gauge("pool_inflight_requests", "Forwards sent and not yet answered", registry=r)
        g.set_function(inflight)
        self._retries_seen = 0

    def observe(self, row: Row, retries_total: int) -> None:
        step = str(row.step)
        self.items.labels(step, row.status).inc()
        if row.status == "error":
            self.errors.labels(step, row.error_kind or "unknown").inc()
        if row.removed:
            self.removed.labels(step).inc()
        self.forwards.labels(step).inc(len(row.forwards))
        for f in row.forwards:
            self.latency.labels(step).observe(f.latency_s)
        if retries_total > self._retries_seen:
            self.retries.inc(retries_total - self._retries_seen)
            self._retries_seen = retries_total

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Expose /metrics; port 0 picks a free one. Returns the port."""
        server, _ = start_http_server(port, addr=addr, registry=self.registry)
        return int(server.server_port)
