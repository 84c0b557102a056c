"""The OpenCL allocator: one buffer per pool arena, tensors as that buffer at aligned offsets."""

import threading

import numpy as np
import pytest

from flowrt.engine.memory.pool import PoolManager
from flowrt.workers.gpu.allocator import DeviceArena, OpenCLAllocator, device_memory_manager
from flowrt.workers.gpu.arena_cache import ArenaCache
from flowrt.workers.gpu.device import cl

F32 = np.dtype(np.float32)


def test_alignment_is_the_devices_base_address_alignment_in_bytes(gpu):
    allocator = OpenCLAllocator(gpu)
    assert allocator.alignment == gpu.device.mem_base_addr_align // 8
    manager = device_memory_manager(gpu)
    assert manager.lifetime_manager.alignment == allocator.alignment


def test_tensors_are_the_one_arena_buffer_at_their_offsets(gpu):
    allocator = OpenCLAllocator(gpu)
    arena = allocator.allocate(4 * allocator.alignment)
    assert isinstance(arena, DeviceArena) and arena.nbytes == 4 * allocator.alignment
    offset = 2 * allocator.alignment
    tensor = allocator.view(arena, offset, (2, 3), F32)
    assert tensor.shape == (2, 3) and tensor.dtype == F32
    assert tensor.buffer is arena.buffer and tensor.offset == offset  # no sub-buffer
    assert tensor.kernel_args == (arena.buffer, offset // 4)  # what a kernel takes: the first element's index
    assert allocator.view(arena, offset, (2, 3), F32) is tensor  # made once per pool
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    cl.enqueue_copy(gpu.queue, tensor.buffer, values, dst_offset=tensor.offset, is_blocking=True)
    whole = np.empty(arena.nbytes // 4, np.float32)
    cl.enqueue_copy(gpu.queue, whole, arena.buffer, is_blocking=True)
    np.testing.assert_array_equal(whole[offset // 4 : offset // 4 + 6], values.ravel())
    np.testing.assert_array_equal(tensor.get(), values)  # read from its offset
    np.testing.assert_array_equal(tensor.reshape(3, 2).get(), values.reshape(3, 2))  # a view keeps it


def test_an_offset_off_the_base_address_alignment_is_refused(gpu):
    allocator = OpenCLAllocator(gpu)
    arena = allocator.allocate(2 * allocator.alignment)
    with pytest.raises(ValueError, match="not a multiple of the device's base-address alignment"):
        allocator.view(arena, 4, (4,), F32)


async def test_a_device_pool_is_zeroed_when_released(gpu):
    allocator = OpenCLAllocator(gpu)
    pools = PoolManager(1, {"GpuAcc": 2 * allocator.alignment}, {"GpuAcc": allocator}, zero_on_release=True)
    async with pools.acquire() as pool:
        tensor = pool.view("GpuAcc", allocator.alignment, (8,), F32)
        cl.enqueue_copy(
            gpu.queue, tensor.buffer, np.ones(8, np.float32), dst_offset=tensor.offset, is_blocking=True
        )
        assert pool.nbytes == 2 * allocator.alignment
    assert not tensor.get().any()


def test_an_arena_no_pool_holds_goes_back_to_the_device_cache_with_its_views(gpu):
    import gc

    allocator = OpenCLAllocator(gpu)
    size = 37 * allocator.alignment  # a size no other test's arena has
    arena = allocator.allocate(size)
    view = allocator.view(arena, allocator.alignment, (4,), F32)
    buffer_ptr, view_ptr = arena.buffer.int_ptr, view.buffer.int_ptr
    cached_before = len(gpu.arena_cache)
    del arena, view
    gc.collect()
    assert len(gpu.arena_cache) == cached_before + 1
    again = allocator.allocate(size)
    assert again.buffer.int_ptr == buffer_ptr and again.nbytes == size
    assert allocator.view(again, allocator.alignment, (4,), F32).buffer.int_ptr == view_ptr
    assert len(gpu.arena_cache) == cached_before
    larger = allocator.allocate(8 * size)  # nothing cached fits: a new buffer
    assert larger.buffer.int_ptr != buffer_ptr and larger.buffer.size == 8 * size


def test_giving_a_buffer_back_never_waits_for_a_take():
    """A tensor's finalizer gives its buffer back, and the garbage collector may run it inside
    ``take`` on the thread that holds the cache's lock: ``give`` must not wait for it."""

    class Buffer:
        size = 64

    cache = ArenaCache()
    given = threading.Event()
    with cache._lock:  # as inside take
        threading.Thread(target=lambda: (cache.give(Buffer(), {}), given.set()), daemon=True).start()
        assert given.wait(timeout=10)
    taken = cache.take(48)
    assert taken is not None and isinstance(taken[0], Buffer) and len(cache) == 0
