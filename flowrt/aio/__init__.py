"""flowrt under asyncio: the same public async API as under trio.

``async with flowrt.Runtime() as rt`` under ``asyncio.run`` starts the runtime in a trio loop
of its own thread (``bridge.AsyncioBridge``); ``rt.load`` then returns an ``AioLoadedNetwork``
and ``model.stream()`` / ``pipeline.stream()`` an ``AioStream`` (``proxies``), whose async
methods await the engine's own in that thread. Under trio none of this is used.
"""

from flowrt.aio.bridge import AsyncioBridge, async_library
from flowrt.aio.proxies import AioLoadedNetwork, AioStream, asyncio_stages, trio_side

__all__ = ["AioLoadedNetwork", "AioStream", "AsyncioBridge", "async_library", "asyncio_stages", "trio_side"]
