"""The worker's HTTP path (workers.transport, workers.client) against a real simulator over loopback:
answers, per-request timeouts, failures mapped to httpx's errors, and the client's retry rules."""

from __future__ import annotations

import asyncio
import time

import httpx
import orjson
import pytest

from pool_queue.errors import ForwardError, RetriesExhausted, ServerUnreachable
from pool_queue.proc.procs import Procs, free_port, wait_health
from pool_queue.protocol import Protocol
from workers.client import VLLMClient
from workers.transport import SlimTransport
from workers.waiting import Stop

P = Protocol()
HANG_S = 60.0  # a test timeout only: it ends a hang, it never judges how long something took
BODY = orjson.dumps(P.request_body(1, "What happens next?", ["a", "b", "c", "d"], []))


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with Procs(tmp_path_factory.mktemp("clientlogs")) as procs:
        ok = procs.sim("ok", free_port(), "--zero-latency")
        hang = procs.sim("hang", free_port(), "--zero-latency", "--faults", "hang:1.0", "--hang-s", "30")
        flaky = procs.sim("flaky", free_port(), "--zero-latency", "--fault-schedule", "1-2:503,4:nologprobs")
        for u in (ok, hang, flaky):
            wait_health(u, 20)
        yield {"ok": ok, "hang": hang, "flaky": flaky}
        procs.stop("hang", timeout=0.1)  # a request it still holds (--hang-s 30) would keep it 5 s from ending


def post(url: str, **extensions: object) -> httpx.Request:
    return httpx.Request("POST", url + "/v1/chat/completions", content=BODY,
                         headers={"Content-Type": "application/json"}, extensions=extensions)  # fmt: skip


def test_slim_transport_answers_times_out_and_maps_errors(sims: dict[str, str]) -> None:
    async def go() -> None:
        t = SlimTransport(8, timeout_s=1.0)
        r = await t.handle_async_request(post(sims["ok"]))
        top = orjson.loads(r.content)["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        assert r.status_code == 200 and len(top) == 20
        # which timeout ended each wait is in its message, not in how long it took; wait_for only ends a hang
        with pytest.raises(httpx.ReadTimeout, match=r"no answer within 1\.0 s"):  # the transport's own (a forward)
            await asyncio.wait_for(t.handle_async_request(post(sims["hang"])), HANG_S)
        slow = SlimTransport(8, timeout_s=120.0)
        with pytest.raises(httpx.ReadTimeout, match=r"no answer within 0\.3 s"):  # a request's own (a health probe's)
            await asyncio.wait_for(  # wins over the transport's
                slow.handle_async_request(post(sims["hang"], timeout={"connect": 1.0, "read": 0.3})), HANG_S
            )
        await slow.aclose()
        with pytest.raises(httpx.ConnectError):
            await t.handle_async_request(httpx.Request("GET", f"http://127.0.0.1:{free_port()}/health"))
        await t.aclose()

    asyncio.run(go())


def test_client_retries_transient_and_stops_on_permanent(sims: dict[str, str]) -> None:
    async def go() -> None:
        c = VLLMClient(sims["flaky"], max_attempts=4, backoff_s=0.01)
        answer = await c.forward(BODY)  # requests 1-2 get 503, the third answers
        assert answer.attempts == 3 and len(answer.top) == 20 and c.retries == 2
        with pytest.raises(ForwardError, match="no logprobs"):  # request 4: permanent at once
            await c.forward(BODY)
        await c.aclose()
        h = VLLMClient(sims["hang"], timeout_s=0.3, max_attempts=2, backoff_s=0.01)
        with pytest.raises(RetriesExhausted, match="after 2 attempts"):
            await h.forward(BODY)
        await h.aclose()

    asyncio.run(go())


@pytest.mark.slow
def test_an_outage_is_waited_out_and_charges_no_attempt(procs: Procs) -> None:
    """Nothing listens at first: the forward waits on /health instead of spending its attempts, and
    goes through once a server comes up on that port."""
    port = free_port()

    async def go() -> None:
        async with VLLMClient(f"http://127.0.0.1:{port}", max_attempts=2, backoff_s=0.01) as c:
            sent = asyncio.ensure_future(c.forward(BODY))

            async def down() -> None:
                while c.up:
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(down(), HANG_S)
            seen_down = time.monotonic()  # the outage began before this
            await asyncio.sleep(2.5)  # longer than two attempts' backoff: only the outage rule keeps it alive
            assert not sent.done() and not c.up
            starting = time.monotonic()  # the outage ends after this, once the server answers
            procs.sim("late", port, "--zero-latency")
            answer = await asyncio.wait_for(sent, 60)
            # the outage is timed whole: it spans what the test saw down (an order of events, not a bound)
            assert answer.attempts == 1 and c.retries == 0 and c.up and c.outage_s >= starting - seen_down

    asyncio.run(go())


def test_a_port_that_does_not_speak_http_fails_at_once(redis_url: str) -> None:
    url = redis_url.replace("redis://", "http://")  # a Redis port, asked for HTTP

    async def go() -> None:
        async with VLLMClient(url) as c:
            stop = Stop()
            stop.event.set()  # no waiting: any wait would end in Stopped, not in this error
            with pytest.raises(ServerUnreachable, match="does not answer HTTP"):
                await c.wait_first(limit_s=60, stop=stop)

    asyncio.run(go())
