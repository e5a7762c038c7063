"""The worker's Redis link against a real redis-server at its maxmemory: a refused write is an outage that
reads do not end, and the refused call, once through, does (an idle worker's heartbeat is enough)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from redis import Redis

from workers.redis_link import RedisLink


def test_a_full_redis_is_one_outage_that_only_a_refused_write_ends(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    conn = Redis.from_url(redis_url)
    conn.set("x", "1")
    link = RedisLink(redis_url, 60, "w")

    async def run() -> None:
        conn.config_set("maxmemory-policy", "noeviction")
        conn.config_set("maxmemory", 1)
        assert await link.attempt(conn.set, "k", "v") is None and not link.up  # a heartbeat refused
        assert await link.call(conn.get, "x") == b"1" and not link.up  # a read goes through: still full
        assert await link.attempt(conn.exists, "x") == 1 and not link.up
        conn.config_set("maxmemory", 0)
        assert await link.attempt(conn.set, "k", "v") and link.up  # the refused write, through

    with caplog.at_level(logging.WARNING, logger="workers.redis_link"):
        asyncio.run(run())
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "is at its maxmemory and refuses writes" in said[0] and "is back after" in said[1]
