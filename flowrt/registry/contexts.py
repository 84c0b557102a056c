"""Backend contexts' load hooks and user allocators: what a runtime asks of its backends
beyond building workloads (Arm NN's IBackendContext and CustomMemoryAllocator).

A context (what ``create_context(options)`` returns) may define ``before_load``,
``after_load``, ``before_unload`` and ``after_unload``; each is called with the network id,
in that order, around each load and each unload, on every context the runtime holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flowrt.errors import BackendError, FlowrtError, InputError

LOAD_HOOKS = ("before_load", "after_load", "before_unload", "after_unload")


def call_hooks(contexts: Mapping[str, Any], hook: str, network_id: int) -> None:
    """Call ``hook(network_id)`` on each context that has it; BackendError names the backend
    whose hook raised."""
    for bid, context in contexts.items():
        method = getattr(context, hook, None)
        if method is None:
            continue
        try:
            method(network_id)
        except FlowrtError:
            raise
        except Exception as e:
            raise BackendError(f"backend {bid}'s context failed in {hook}({network_id}): {e}") from e


def check_allocators(allocators: Mapping[str, Any] | None, registry: Any) -> dict[str, Any]:
    """``allocators`` (``{backend id: allocator}``) when each names a registered backend whose
    capabilities allow a user allocator (``custom_allocator``) and each has ``alignment`` and
    ``allocate(nbytes)``; InputError or BackendError saying which one and why otherwise."""
    checked = {}
    for bid, allocator in (allocators or {}).items():
        if not registry.is_registered(bid):
            raise BackendError(
                f"allocators names backend {bid!r}, which is not registered (registered: "
                f"{', '.join(registry.ids())})"
            )
        if not registry.get(bid).capabilities.get("custom_allocator", False):
            raise BackendError(
                f"allocators names backend {bid!r}, whose capabilities do not allow a custom "
                "allocator (capability custom_allocator is not True)"
            )
        alignment = getattr(allocator, "alignment", None)
        if (
            not callable(getattr(allocator, "allocate", None))
            or not isinstance(alignment, int)
            or alignment < 1
        ):
            raise InputError(
                f"allocators[{bid!r}]: expected an Allocator (an int 'alignment' >= 1 and an "
                f"'allocate(nbytes)' method), found {type(allocator).__name__}"
            )
        checked[bid] = allocator
    return checked
