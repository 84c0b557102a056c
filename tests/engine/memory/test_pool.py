"""PoolManager: N pools lent to runs, FIFO within a priority, always given back."""

import numpy as np
import pytest
import trio
import trio.testing

from flowrt.engine.memory.allocator import HostAllocator
from flowrt.engine.memory.lending import PriorityLender
from flowrt.engine.memory.pool import PoolManager


def _manager(count, zero=False):
    return PoolManager(count, {"CpuRef": 256}, {"CpuRef": HostAllocator()}, zero_on_release=zero)


def test_arenas_are_aligned_and_sized():
    pool = _manager(1).pools[0]
    arena = pool.arenas["CpuRef"]
    assert arena.nbytes == 256
    assert arena.ctypes.data % HostAllocator.alignment == 0


async def test_run_beyond_the_pool_count_waits_until_one_is_returned(autojump_clock):
    manager = _manager(2)
    order = []

    async def hold(name, delay):
        async with manager.acquire() as pool:
            order.append((name, "got", pool.index))
            await trio.sleep(delay)
        order.append((name, "gave back"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hold, "a", 1.0)
        nursery.start_soon(hold, "b", 2.0)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(hold, "c", 0.5)
        await trio.testing.wait_all_tasks_blocked()
        assert manager.free_count == 0
        assert ("c", "got", 0) not in order and ("c", "got", 1) not in order
    assert order.index(("a", "gave back")) < next(
        i for i, e in enumerate(order) if e[0] == "c" and e[1] == "got"
    )
    assert manager.free_count == 2


async def test_waiters_are_served_by_priority_then_first_come(autojump_clock):
    manager = _manager(1)
    served = []

    async def want(name, priority):
        async with manager.acquire(priority):
            served.append(name)
            await trio.sleep(0.1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(want, "first", 1)
        await trio.testing.wait_all_tasks_blocked()
        for name, priority in [("low", 2), ("medium-1", 1), ("high", 0), ("medium-2", 1)]:
            nursery.start_soon(want, name, priority)
            await trio.testing.wait_all_tasks_blocked()
    assert served == ["first", "high", "medium-1", "medium-2", "low"]


async def test_pool_returned_when_the_holder_fails_or_a_waiter_is_cancelled():
    manager = _manager(1)
    with pytest.raises(ValueError):
        async with manager.acquire():
            raise ValueError("boom")
    assert manager.free_count == 1
    async with manager.acquire():
        with trio.move_on_after(0.01):
            async with manager.acquire():
                pytest.fail("a second pool was lent while the only one was out")
    assert manager.free_count == 1
    assert manager._waiting == []


async def test_pool_is_zeroed_before_it_is_lent_again_when_asked():
    manager = _manager(1, zero=True)
    async with manager.acquire() as pool:
        pool.arenas["CpuRef"][:] = 7
    async with manager.acquire() as pool:
        assert not pool.arenas["CpuRef"].any()
    plain = _manager(1)
    async with plain.acquire() as pool:
        pool.arenas["CpuRef"][:] = 7
    async with plain.acquire() as pool:
        assert np.all(pool.arenas["CpuRef"] == 7)


async def test_a_waiting_low_priority_run_ages_and_is_not_starved(autojump_clock):
    manager = PoolManager(1, {"CpuRef": 64}, {"CpuRef": HostAllocator()}, aging_interval=1.0)
    served = []

    async def want(name, priority, hold):
        async with manager.acquire(priority):
            served.append((name, trio.current_time()))
            await trio.sleep(hold)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(want, "first", 0, 0.5)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(want, "low", 2, 0.5)
        await trio.testing.wait_all_tasks_blocked()

        async def high_stream():
            # a HIGH request arrives every 0.5 s, each holding the pool for 0.5 s
            for i in range(8):
                nursery.start_soon(want, f"high{i}", 0, 0.5)
                await trio.sleep(0.5)

        nursery.start_soon(high_stream)
    names = [name for name, _ in served]
    low_at = dict(served)["low"]
    # after two intervals of waiting, LOW competes as HIGH and, having waited longest, wins
    assert names.index("low") < names.index("high7")
    assert low_at <= 2.5


def test_priority_normal_is_medium():
    from flowrt.types import Priority

    assert Priority.NORMAL is Priority.MEDIUM


async def test_on_lent_puts_an_item_to_use_as_it_is_lent():
    lender: PriorityLender[str] = PriorityLender(["free"])
    used: list[str] = []
    assert await lender.take(on_lent=used.append) == "free"
    assert used == ["free"]  # lent at once: called before take returns
    taken: list[str] = []

    async def wait_for_one() -> None:
        taken.append(await lender.take(on_lent=used.append))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_for_one)
        await trio.testing.wait_all_tasks_blocked()
        lender.give_back("returned")
        # called inside give_back, before the waiting task has run again
        assert (used, taken) == (["free", "returned"], [])
    assert taken == ["returned"]


async def test_a_waiter_cancelled_before_it_runs_again_is_not_put_to_use():
    lender: PriorityLender[str] = PriorityLender()
    used: list[str] = []
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def wait_for_one() -> None:
            with scope:
                await lender.take(on_lent=used.append)

        nursery.start_soon(wait_for_one)
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()
        lender.give_back("returned")  # in the same step: the waiter has not run since
    assert used == []
    assert (lender.free_count, lender.waiting_count) == (1, 0)


async def test_take_nowait_lends_a_free_item_only_when_nobody_waits():
    lender: PriorityLender[str] = PriorityLender(["only"])
    assert lender.take_nowait() == "only"
    assert lender.take_nowait() is None  # none free
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lender.take)
        await trio.testing.wait_all_tasks_blocked()
        lender.give_back("only")  # to the waiter, not to the free items
        assert (lender.take_nowait(), lender.free_count) == (None, 0)
    lender.give_back("only")
    assert (lender.take_nowait(), lender.free_count) == ("only", 0)
