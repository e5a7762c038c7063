"""A worker's Prometheus metrics (workers.metrics), scraped over loopback as Prometheus would."""

from __future__ import annotations

import httpx
from craft import row
from prometheus_client.parser import text_string_to_metric_families

from pool_queue.rows import Row
from workers.metrics import Metrics

ITEM = {"item_id": "m-1", "n_options": 4, "gold": 2, "benchmark": "B", "video_id": "v1"}


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for fam in text_string_to_metric_families(text)
        for sample in fam.samples
    }


def test_rows_are_counted_by_step_status_and_kind_and_retries_once() -> None:
    inflight = [3]
    m = Metrics(lambda: inflight[0])
    port = m.serve(0, "127.0.0.1")
    m.observe(Row.model_validate(row(ITEM, 1, removed=True)), retries_total=2)
    m.observe(Row.model_validate(row(ITEM, 2, status="error")), retries_total=2)  # no new retries
    m.observe(Row.model_validate(row(ITEM, 1)), retries_total=5)
    inflight[0] = 7
    got = scrape(port)
    assert got[("pool_items_total", (("status", "ok"), ("step", "1")))] == 2
    assert got[("pool_items_total", (("status", "error"), ("step", "2")))] == 1
    assert got[("pool_items_removed_total", (("step", "1"),))] == 1
    assert got[("pool_item_errors_total", (("kind", "permanent"), ("step", "2")))] == 1
    assert got[("pool_forwards_total", (("step", "1"),))] == 8  # two step-1 rows of 4 orders
    assert ("pool_forwards_total", (("step", "2"),)) in got  # the error row: counted as 0 forwards
    assert got[("pool_forward_retries_total", ())] == 5
    assert got[("pool_forward_latency_seconds_count", (("step", "1"),))] == 8
    assert got[("pool_inflight_requests", ())] == 7  # read when scraped
    assert got[("pool_jobs_total", ())] == 0


def test_two_workers_in_one_process_keep_their_own_counts() -> None:
    a, b = Metrics(lambda: 0), Metrics(lambda: 0)
    a.observe(Row.model_validate(row(ITEM, 3)), retries_total=0)
    pa, pb = a.serve(0, "127.0.0.1"), b.serve(0, "127.0.0.1")
    assert pa != pb
    assert scrape(pa)[("pool_items_total", (("status", "ok"), ("step", "3")))] == 1
    assert not any(name == "pool_items_total" for name, _ in scrape(pb))
