"""The worker's Redis link against a real redis-server at its maxmemory: a refused write is an outage that
reads do not end, and the refused call, once through, does (an idle worker's heartbeat is enough)."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from redis import Redis

from pool_queue.proc.procs import free_port
from workers.redis_link import RedisLink


def test_a_full_redis_is_one_outage_that_only_a_refused_write_ends(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    conn = Redis.from_url(redis_url)
    conn.set("x", "1")
    link = RedisLink(redis_url, 60, "w", settle_s=0)

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


def test_a_full_redis_that_takes_a_few_writes_then_refuses_again_is_one_episode(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """As RQ's keys expire a full Redis takes a write or two, then refuses again: one line and one "back" line
    while the refusals come within the settle time of each other; a refusal after it is a new episode."""
    conn = Redis.from_url(redis_url)
    link = RedisLink(redis_url, 60, "w", settle_s=0.5)

    async def full(on: bool) -> None:
        conn.config_set("maxmemory-policy", "noeviction")
        conn.config_set("maxmemory", 1 if on else 0)

    async def run() -> None:
        await full(True)
        assert await link.attempt(conn.set, "k", "v") is None
        await full(False)
        assert await link.attempt(conn.set, "k", "v") and not link.up  # through, not yet settled
        await full(True)
        assert await link.attempt(conn.set, "k", "v") is None and not link.up  # refused again: the same episode
        await full(False)
        assert await link.attempt(conn.set, "k", "v") and not link.up
        await asyncio.sleep(0.6)  # past the settle time with nothing refused
        assert await link.attempt(conn.get, "k") and link.up
        await full(True)
        assert await link.attempt(conn.set, "k", "v") is None and not link.up  # a new episode
        await full(False)

    with caplog.at_level(logging.WARNING, logger="workers.redis_link"):
        asyncio.run(run())
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 3, said
    assert "maxmemory" in said[0] and "is back after" in said[1] and "maxmemory" in said[2]


def test_an_answer_to_a_call_sent_before_the_outage_does_not_end_it(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The link runs two calls at once: one sent before Redis went may be answered after another found it
    gone. That answer says nothing of now; only a call sent after the outage began ends it (one outage, one
    "back" line, as a restart under load gives)."""
    conn = Redis.from_url(redis_url)
    gone = Redis(port=free_port(), socket_connect_timeout=1)  # nothing listens there: connection refused
    link = RedisLink(redis_url, 60, "w", settle_s=0)
    answered = threading.Event()

    def answered_before_the_outage() -> bytes | None:
        answered.wait(10)
        return conn.get("x")

    async def run() -> None:
        conn.set("x", "1")
        early = asyncio.ensure_future(link.attempt(answered_before_the_outage))
        await asyncio.sleep(0)  # sent now, answered later
        assert await link.attempt(gone.ping) is None and not link.up
        answered.set()
        assert await early == b"1" and not link.up  # sent before the outage began: it stays
        assert await link.attempt(conn.get, "x") == b"1" and link.up  # sent after: Redis is back

    with caplog.at_level(logging.WARNING, logger="workers.redis_link"):
        asyncio.run(run())
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "unreachable (ConnectionError)" in said[0] and "is back after" in said[1], said
