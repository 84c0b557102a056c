"""The progress bar of ``Runtime.load``: layers prepared (their kernels compiled) so far.

With a cold numba cache, loading a large model on CpuAcc compiles kernels for tens of seconds;
with a warm one it takes well under a second. ``rt.load(opt, progress=True)`` draws a tqdm bar
on stderr, "compiling kernels" over the model's layers with the one being prepared, once the
load has run :data:`SHOW_AFTER` seconds, so a warm load prints nothing. Library use is quiet
by default (``progress=None`` reads :data:`load_progress`, False unless set); the ``flowrt``
command line sets :data:`load_progress` for its commands when :func:`bars_wanted` says so, so
the loads they make, in ``flowrt.bench`` too, show the bar.

Every bar of the command line (this one, ``flowrt run --iterations``, ``flowrt bench``'s
requests) goes to stderr, and only when stderr is a terminal: a log file or a pipe gets no
carriage-return clutter. ``FLOWRT_PROGRESS=1`` in the environment draws them anyway,
``FLOWRT_PROGRESS=0`` never.

The loading thread only counts (:meth:`LoadProgress.begin`, :meth:`LoadProgress.end`); a
trio task of the runtime's nursery draws, so a layer that compiles for seconds still shows
the time going by.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import trio

# The default of ``Runtime.load(progress=None)``; the CLI sets it for its commands.
load_progress: contextvars.ContextVar[bool] = contextvars.ContextVar("load_progress", default=False)
# Seconds a load runs before its bar is shown, and between redraws while one layer compiles.
SHOW_AFTER = 1.0
REDRAW = 0.5
# "1": draw the command line's bars even when stderr is not a terminal; "0": never.
PROGRESS_ENV = "FLOWRT_PROGRESS"


def bars_wanted() -> bool:
    """Whether the command line draws progress bars: stderr is a terminal, unless
    :data:`PROGRESS_ENV` says otherwise."""
    forced = os.environ.get(PROGRESS_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False


class LoadProgress:
    """Layers prepared so far: counted by the loading thread, drawn by :meth:`draw` in trio.

    ``begin``/``end`` are plain attribute writes, safe from any thread; every tqdm call
    happens in the trio thread.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.layer = ""
        self._bar: Any = None
        self._scope = trio.CancelScope()

    def begin(self, layer: str) -> None:
        """The loading thread starts preparing ``layer``."""
        self.layer = layer

    def end(self) -> None:
        """The loading thread has prepared its current layer."""
        self.done += 1

    async def draw(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Show the bar after ``SHOW_AFTER`` seconds (at once when 0), then redraw it until
        :meth:`close`."""
        with self._scope:
            if SHOW_AFTER <= 0:  # at once, before the load goes on
                self._show()
            task_status.started()
            if self._bar is None:
                await trio.sleep(SHOW_AFTER)
                self._show()
            while True:
                self._redraw()
                await trio.sleep(REDRAW)

    def _show(self) -> None:
        from tqdm import tqdm

        self._bar = tqdm(
            total=self.total, desc="compiling kernels", unit="layer", file=sys.stderr, leave=False
        )

    def _redraw(self) -> None:
        self._bar.n = self.done
        self._bar.set_postfix_str(self.layer, refresh=False)
        self._bar.refresh()

    def close(self) -> None:
        """Stop drawing; a bar that was shown is drawn once more as it ends, then cleared."""
        self._scope.cancel()
        if self._bar is not None:
            self._redraw()
            self._bar.close()
            self._bar = None


@contextlib.asynccontextmanager
async def layer_progress(nursery: trio.Nursery, total: int, show: bool) -> AsyncIterator[LoadProgress]:
    """A :class:`LoadProgress` over ``total`` layers; drawn by a task in ``nursery`` when
    ``show``. The bar ends with the block, however it ends (cancellation included)."""
    progress = LoadProgress(total)
    if show:
        await nursery.start(progress.draw)
    try:
        yield progress
    finally:
        progress.close()
