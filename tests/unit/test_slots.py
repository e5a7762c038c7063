"""The in-flight bound a batch takes at once: first come, first served, no partial holds, cancellation safe."""

from __future__ import annotations

import asyncio

from workers.slots import Slots


def run(coro):
    return asyncio.run(coro)


def test_a_batch_takes_its_slots_at_once_and_in_turn():
    async def go():
        slots, order = Slots(4), []
        one = slots.take(1)
        await one.__aenter__()  # a single forward holds one slot

        async def batch(name: str, k: int) -> None:
            async with slots.take(k):
                order.append(name)
                await asyncio.sleep(0)

        big = asyncio.create_task(batch("big", 4))
        await asyncio.sleep(0)
        small = asyncio.create_task(batch("small", 1))  # it would fit, but the big batch came first
        await asyncio.sleep(0)
        assert order == [] and slots.free == 3
        await one.__aexit__(None, None, None)
        await asyncio.gather(big, small)
        assert order == ["big", "small"] and slots.free == 4

    run(go())


def test_many_batches_larger_than_half_the_bound_never_wait_on_each_other():
    async def go():
        slots, done = Slots(4), []

        async def batch(i: int) -> None:
            async with slots.take(3):
                assert slots.free >= 0
                await asyncio.sleep(0)
                done.append(i)

        await asyncio.wait_for(asyncio.gather(*(batch(i) for i in range(50))), 10)
        assert sorted(done) == list(range(50)) and slots.free == 4

    run(go())


def test_a_cancelled_wait_gives_its_place_to_the_next_and_a_larger_batch_is_capped():
    async def go():
        slots = Slots(2)
        hold = slots.take(2)
        await hold.__aenter__()
        second, third = slots.take(2), slots.take(1)
        waiting = asyncio.create_task(second.__aenter__())
        after = asyncio.create_task(third.__aenter__())
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.sleep(0)
        await hold.__aexit__(None, None, None)
        await asyncio.wait_for(after, 5)  # the cancelled batch's place went to the next in line
        assert slots.free == 1
        await third.__aexit__(None, None, None)
        assert slots.free == 2
        async with Slots(3).take(10):  # larger than the bound: takes all of it rather than wait for ever
            pass

    run(go())
