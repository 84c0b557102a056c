"""Awaiting Ray object references from trio.

Ray settles an ``ObjectRef``'s future in a thread of its own; the one way into a trio loop from a
foreign thread that never blocks that thread is the loop's token (``TrioToken.run_sync_soon``),
which is why this module uses ``trio.lowlevel``: the callback sets a ``trio.Event`` through it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import ray
import trio

logger = logging.getLogger(__name__)


async def resolve(ref: ray.ObjectRef) -> Any:
    """The value of ``ref``, awaited without blocking the trio loop; Ray's error when the task
    that makes it failed (``ray.exceptions.RayActorError`` when its actor died).

    Cancelled meanwhile, the task behind ``ref`` is asked to stop (Ray cancels the coroutine of
    an async actor's method) and the Cancelled goes on at once.
    """
    future = ref.future()
    if not future.done():
        token = trio.lowlevel.current_trio_token()
        settled = trio.Event()

        def wake(_: Any) -> None:
            with contextlib.suppress(trio.RunFinishedError):  # the loop ended: no one waits
                token.run_sync_soon(settled.set)

        future.add_done_callback(wake)
        try:
            await settled.wait()
        except trio.Cancelled:
            with contextlib.suppress(Exception):  # best effort: the task may have ended already
                ray.cancel(ref)
            raise
    return future.result()
