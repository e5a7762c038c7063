"""The in-flight bound, by cost: a request starts while what is in flight costs less than the bound, first come,
first served; so it overshoots by less than its own cost, never deadlocks, never starves a large batch, and a
cancelled wait gives its place back. Driven step by step on the event loop (no timers, no clock): each request
holds its slots until the test releases it."""

from __future__ import annotations

import asyncio
import random

import pytest

from workers.screen import batch_cost
from workers.slots import Slots


class Driver:
    """Requests that arrive, are admitted (in the order recorded) and hold their cost until released."""

    def __init__(self, slots: Slots) -> None:
        self.slots = slots
        self.admitted: list[str] = []
        self.before: dict[str, float] = {}  # what was in flight when it was admitted
        self.in_flight = 0.0
        self.cost: dict[str, float] = {}
        self._release: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def arrive(self, name: str, cost: float = 1.0) -> None:
        self.cost[name] = cost
        self._release[name] = asyncio.Event()
        self.tasks[name] = asyncio.create_task(self._hold(name, cost))

    async def _hold(self, name: str, cost: float) -> None:
        async with self.slots.take(cost):
            self.admitted.append(name)
            self.before[name] = self.in_flight
            self.in_flight += cost
            await self._release[name].wait()
        self.in_flight -= cost  # runs before any request its release let in

    async def release(self, name: str) -> None:
        self._release[name].set()
        await self.tasks[name]
        await settle()

    def running(self) -> list[str]:
        return [n for n in self.admitted if not self.tasks[n].done()]


async def settle() -> None:
    """Let every task that can run, run (a handful of loop turns: nothing here sleeps)."""
    for _ in range(10):
        await asyncio.sleep(0)


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_a_request_starts_while_less_than_the_bound_is_in_flight_in_order_of_arrival() -> None:
    async def go() -> None:
        d = Driver(Slots(4))
        for n in ("a", "b", "c"):
            d.arrive(n)
        await settle()
        d.arrive("batch", 4)  # 3 in flight < 4: it starts now, though all 4 slots are not free
        await settle()
        assert d.admitted == ["a", "b", "c", "batch"] and d.slots.held == 7
        d.arrive("x")
        d.arrive("big", 3)
        d.arrive("y")
        await settle()
        assert d.running() == ["a", "b", "c", "batch"]  # 7 in flight: the rest wait, in order
        for n in ("a", "b", "c"):
            await d.release(n)
        assert d.admitted[4:] == []  # 4 still in flight: nothing starts
        await d.release("batch")
        assert d.admitted[4:] == ["x", "big"]  # 0, then 1 < 4: both; then 4 in flight: y waits
        await d.release("x")
        assert d.admitted[4:] == ["x", "big", "y"]
        await d.release("big")
        await d.release("y")
        assert d.slots.held == 0

    run(go())


def test_what_is_in_flight_overshoots_the_bound_by_less_than_the_last_request_admitted() -> None:
    """A seeded stream of forwards and batches (whole and fractional costs, some above the bound itself),
    released in a random order: every admission found less than the bound in flight, and in flight never
    reached the bound plus the largest cost."""

    async def go() -> None:
        rng = random.Random(7)
        size = 8
        d = Driver(Slots(size))
        costs = [1.0, 1.0, 1.0, 2.0, 8.0, 12.0, 1 + 7 / 33, 15 / 33, 0.25]
        peak = 0.0
        arrived = 0
        while arrived < 300 or d.running():
            if arrived < 300 and rng.random() < 0.6:
                d.arrive(f"r{arrived}", rng.choice(costs))
                arrived += 1
            elif d.running():
                await d.release(rng.choice(d.running()))
            await settle()
            peak = max(peak, d.slots.held)
        assert len(d.admitted) == 300 and d.slots.held == 0 and d.in_flight == pytest.approx(0)
        for n in d.admitted:
            assert d.before[n] < size, n
        assert peak < size + max(costs)
        assert d.admitted == sorted(d.admitted, key=lambda n: int(n[1:]))  # first come, first served

    run(go())


def test_a_large_batch_is_not_starved_by_a_stream_of_small_requests() -> None:
    async def go() -> None:
        d = Driver(Slots(4))
        for i in range(4):
            d.arrive(f"s{i}")
        await settle()
        d.arrive("large", 12)  # larger than the bound itself
        for i in range(4, 40):  # a small request arrives before each release: the bound never empties
            d.arrive(f"s{i}")
            await settle()
            await d.release(d.running()[0])
            if "large" in d.admitted:
                break
        assert d.admitted[4] == "large" and i == 4  # in at the first release, before any later small one
        assert d.running() == ["s1", "s2", "s3", "large"]
        for n in ("s1", "s2", "s3"):
            await d.release(n)
        assert d.admitted[5:] == []  # 12 in flight: the small ones behind it wait for it
        await d.release("large")
        assert d.admitted[5:] == ["s4"] and d.slots.held == 1
        await d.release("s4")

    run(go())


@pytest.mark.parametrize("cost", [3.0, 5.0, 9.0])
def test_batches_larger_than_half_the_bound_or_the_bound_itself_never_wait_on_each_other(cost: float) -> None:
    async def go() -> None:
        slots, done = Slots(4), []

        async def batch(i: int) -> None:
            async with slots.take(cost):
                await asyncio.sleep(0)
                done.append(i)

        await asyncio.gather(*(batch(i) for i in range(50)))  # one at a time or two: never stuck
        assert sorted(done) == list(range(50)) and slots.held == 0

    run(go())


def test_a_cancelled_wait_gives_its_place_to_the_next() -> None:
    async def go() -> None:
        slots = Slots(2)
        hold = slots.take(2)
        await hold.__aenter__()
        second, third = slots.take(2), slots.take(1)
        waiting = asyncio.create_task(second.__aenter__())
        after = asyncio.create_task(third.__aenter__())
        await settle()
        waiting.cancel()
        await settle()
        await hold.__aexit__(None, None, None)
        await asyncio.wait_for(after, 5)  # the cancelled batch's place went to the next in line
        assert slots.held == 1
        await third.__aexit__(None, None, None)
        assert slots.held == 0

    run(go())


def test_a_batch_costs_its_first_frames_once_and_its_siblings_text() -> None:
    assert batch_cost(8, 0, lead=True) == 8.0  # no frames (step 1's orders): each a forward of its own
    assert batch_cost(8, 32, lead=True) == pytest.approx(1 + 7 / 33)  # a video's first batch
    assert batch_cost(7, 32, lead=False) == pytest.approx(7 / 33)  # the same video's next batch
    assert batch_cost(1, 8, lead=True) == 1.0
