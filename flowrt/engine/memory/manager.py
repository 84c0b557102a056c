"""A backend's memory manager: the allocator its arenas come from and how tensors are packed."""

from __future__ import annotations

import attrs

from flowrt.engine.memory.allocator import Allocator, HostAllocator
from flowrt.engine.memory.lifetime_managers import BlobLifetimeManager, OffsetLifetimeManager


@attrs.define
class MemoryManager:
    """What ``Backend.create_memory_manager()`` returns: an allocator and a lifetime manager."""

    allocator: Allocator = attrs.Factory(HostAllocator)
    lifetime_manager: OffsetLifetimeManager | BlobLifetimeManager = attrs.Factory(OffsetLifetimeManager)
