"""A trio nursery whose errors leave it as themselves, not wrapped in an exception group.

trio's nurseries (``strict_exception_groups``, the default since trio 0.25) wrap whatever
leaves them in a ``BaseExceptionGroup``, even a lone exception, so a caller's
``except RunError`` around ``async with model.stream()`` would never match. A flowrt stream's
tasks catch their errors and hand them to the request they belong to; what leaves its nursery
is the body's own exception, so flowrt unwraps the one layer of grouping its nursery added:

- one exception (beside any ``trio.Cancelled``) leaves as itself — the same object, with its
  traceback, ``__cause__`` and ``__context__``; the Cancelled left out are raised again by trio
  at the next checkpoint while their scope stays cancelled;
- only ``trio.Cancelled``: the group leaves untouched, for trio's cancel scopes to catch;
- several ordinary exceptions, one of them a ``FlowrtError``: the first ``FlowrtError`` leaves,
  the others added to it as notes; anything else (a ``KeyboardInterrupt`` beside another error,
  several non-flowrt errors) leaves as the group.

A group raised by the body itself (a user's own nursery) is kept: only the layer this nursery
added is removed.
"""

from __future__ import annotations

from types import TracebackType

import trio

from flowrt.errors import FlowrtError


def collapse(group: BaseExceptionGroup) -> BaseException:
    """What should leave in place of ``group``, by the rules in the module doc."""
    errors = [e for e in group.exceptions if not isinstance(e, trio.Cancelled)]
    if not errors:
        return group
    if len(errors) == 1:
        return errors[0]
    first = next((e for e in errors if isinstance(e, FlowrtError)), None)
    if first is None or not all(isinstance(e, Exception) for e in errors):
        return group
    for other in errors:
        if other is not first:
            first.add_note(f"raised in the same 'async with' too: {type(other).__name__}: {other}")
    return first


class NurseryManager:
    """The async context manager of :func:`open_nursery`."""

    def __init__(self) -> None:
        self._manager = trio.open_nursery()

    async def __aenter__(self) -> trio.Nursery:
        return await self._manager.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        try:
            return bool(await self._manager.__aexit__(exc_type, exc_value, traceback))
        except BaseExceptionGroup as group:
            error = collapse(group)
            if error is group:
                raise
        if error is exc_value:
            return False  # the body's own exception: Python raises it again, as it was
        # Raised outside the except clause, so that the group does not become its __context__.
        raise error


def open_nursery() -> NurseryManager:
    """``trio.open_nursery()``, whose errors leave as themselves (see the module doc)."""
    return NurseryManager()
