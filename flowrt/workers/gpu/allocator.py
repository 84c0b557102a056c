"""The OpenCL allocator: one device buffer per pool arena, tensors at offsets in it.

The memory planner packs GpuAcc's intermediate tensors at offsets of one arena per pool, as
it does on the host; here an arena is one ``cl.Buffer`` and a tensor at an offset is that
buffer and the offset (``GpuTensor.offset``), which kernels take beside the buffer (see
common.cl). Not sub-buffers: a pool reuses its bytes, so sub-buffers of it overlap, and
NVIDIA's driver (580.159 on an H100) made each launch naming such buffers several times
dearer (densenet121: 110 us a launch against 20 with buffers that overlap none). Offsets keep
the device's base-address alignment (``CL_DEVICE_MEM_BASE_ADDR_ALIGN``, given in bits), as
sub-buffers had to, which is also what vector loads want.

An arena that no pool holds any more goes to its device's :class:`ArenaCache` with its
views, and the next arena of about that size is that buffer again — a caching allocator, as
PyTorch's CUDA one is (releasing a buffer makes NVIDIA's driver wait until the device is
idle): device memory is bounded by the most arena bytes ever live at once, and is given back
when the process ends.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from flowrt.engine.memory.lifetime_managers import OffsetLifetimeManager
from flowrt.engine.memory.manager import MemoryManager
from flowrt.workers.gpu.arena_cache import Views
from flowrt.workers.gpu.context import DeviceContext
from flowrt.workers.gpu.device import cl
from flowrt.workers.gpu.tensor import GpuTensor


class DeviceArena:
    """One pool's GpuAcc arena: a device buffer and the tensor views made on it so far.

    Views are cached by (offset, shape, dtype): the plan is fixed at load, so every run of a
    pool asks for the same few, each made once rather than once per run.
    ``buffer`` may be larger than ``nbytes`` when it is a cached buffer used again.
    """

    def __init__(self, buffer: Any, nbytes: int, views: Views | None = None) -> None:
        self.buffer = buffer
        self.nbytes = nbytes
        self.views: Views = {} if views is None else views


class OpenCLAllocator:
    """Allocates GpuAcc arenas on one device; what GpuAcc's memory manager plans with."""

    def __init__(self, context: DeviceContext) -> None:
        self.context = context
        # The device reports its base-address alignment in bits.
        self.alignment = max(int(context.device.mem_base_addr_align) // 8, 4)

    def allocate(self, nbytes: int) -> DeviceArena:
        """An arena of ``nbytes`` bytes (uninitialized device memory): a cached buffer when one
        fits, else a new one. It returns to the cache when no one holds it any more."""
        size = max(int(nbytes), self.alignment)  # OpenCL refuses empty buffers
        cache = self.context.arena_cache
        cached = cache.take(size)
        if cached is None:
            arena = DeviceArena(cl.Buffer(self.context.context, cl.mem_flags.READ_WRITE, size), size)
        else:
            arena = DeviceArena(cached[0], size, cached[1])
        weakref.finalize(arena, cache.give, arena.buffer, arena.views)
        return arena

    def view(self, arena: DeviceArena, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> GpuTensor:
        """The device tensor of ``shape``/``dtype`` at byte ``offset`` of ``arena``."""
        key = (offset, tuple(shape), np.dtype(dtype))
        tensor = arena.views.get(key)
        if tensor is None:
            if offset % self.alignment:
                raise ValueError(
                    f"device tensor offset {offset} is not a multiple of the device's "
                    f"base-address alignment ({self.alignment} bytes)"
                )
            tensor = arena.views[key] = GpuTensor(arena.buffer, shape, dtype, self.context.queue, offset)
        return tensor

    def zero(self, arena: DeviceArena) -> None:
        """Fill the arena with zero bytes; blocks until done (the pool is idle when zeroed)."""
        cl.enqueue_fill_buffer(self.context.queue, arena.buffer, b"\0", 0, arena.nbytes).wait()


def device_memory_manager(context: DeviceContext) -> MemoryManager:
    """GpuAcc's memory manager: arenas from :class:`OpenCLAllocator`, offsets packed at the
    device's base-address alignment."""
    allocator = OpenCLAllocator(context)
    return MemoryManager(allocator, OffsetLifetimeManager(allocator.alignment))
