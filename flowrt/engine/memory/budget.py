"""The memory budget: the most bytes a step of flowrt may hold, checked before it allocates.

``flowrt.onnx.load`` holds a model's initializers and Constant values to it, ``optimize`` the
network's constants with every layer constant folding would make (a ConstantOfShape, an
Expand, a Tile, a Range), and a ``Runtime`` the memory arenas of the networks it has loaded.
Sizes are Python ints, so a tensor of absurd declared size is refused by its byte count, never
allocated, never overflowed. The default is half the machine's physical memory: far above
what a real model needs, far below what would make the machine swap or the kernel kill the
process.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from flowrt.errors import ArgumentError, ResourceError, ShapeError

# The share of physical memory the default budget allows.
DEFAULT_FRACTION = 0.5


def physical_memory() -> int | None:
    """This machine's physical memory in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def default_memory_budget() -> int | None:
    """Half the machine's physical memory; None (no limit) where it is not known."""
    total = physical_memory()
    return None if total is None or total <= 0 else int(total * DEFAULT_FRACTION)


def check_memory_budget(value: object, where: str = "OptimizerOptions") -> int | None:
    """``value`` as a budget in bytes: None (the default) or a positive int (numpy ints too);
    ArgumentError naming ``where`` and the argument otherwise (a bool, a float, zero or less)."""
    if value is None:
        return None
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral) or int(value) <= 0:
        raise ArgumentError(
            f"{where}: memory_budget must be None or a positive int of bytes, got {value!r} ({type(value).__name__})"
        )
    return int(value)


def tensor_bytes(shape: Iterable[int], itemsize: int) -> int:
    """The bytes of a tensor of ``shape``, exactly (Python ints never overflow)."""
    return math.prod(int(d) for d in shape) * int(itemsize)


class MemoryBudget:
    """Bytes claimed so far against a limit (None: the default for this machine).

    ``option`` names the argument that sets the limit and ``holder`` what holds the bytes
    ``used`` at the start, for messages; ``claim`` raises ResourceError before a claim would
    pass the limit.
    """

    def __init__(self, limit: int | None, option: str, used: int = 0, holder: str = "") -> None:
        self.limit = default_memory_budget() if limit is None else limit
        self.origin = (
            f"the default, half the machine's physical memory; {option} sets it"
            if limit is None
            else f"set by {option}"
        )
        self.option = option
        self.used = used
        self.holder = holder

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more stay within the limit."""
        return self.limit is None or self.used + nbytes <= self.limit

    def claim(self, nbytes: int, what: str) -> None:
        """Count ``nbytes`` for ``what`` (e.g. "layer 'cos' (ConstantOfShape) ..."), or raise
        ResourceError saying what wanted how many bytes, and the budget."""
        if not self.fits(nbytes):
            held = (
                f"; {self.holder or 'earlier claims'} already hold {self.used:,} bytes" if self.used else ""
            )
            raise ResourceError(
                f"{what} needs {nbytes:,} bytes, over the memory budget of {self.limit:,} bytes{held} "
                f"({self.origin})"
            )
        self.used += nbytes

    def out_of_memory(self, error: MemoryError, what: str) -> ResourceError:
        """The ResourceError for an allocation that failed although it was within the budget."""
        limit = "no limit" if self.limit is None else f"{self.limit:,} bytes"
        return ResourceError(
            f"{what}: out of memory, although within the memory budget ({limit}, {self.origin}): "
            f"{error or type(error).__name__}"
        )


def check_layer_outputs(layers: Iterable[Any], budget: MemoryBudget) -> None:
    """Raise ResourceError for the first compute layer one of whose outputs would pass ``budget``
    on its own, before any workload is built for it (``layers``: a graph's layers; Input and
    Constant layers, which have no backend, hold no arena bytes); ShapeError for an output with
    a negative dim, which no memory can be planned for."""
    for layer in layers:
        if layer.backend is None:
            continue
        for out in layer.outputs:
            info = out.info
            if info is None or not info.is_static:
                continue
            if any(d < 0 for d in info.shape):  # a layer kind's shape inference let one through
                raise ShapeError(
                    f"output {out.index} {info} of layer {layer.name!r} ({layer.kind}) has a negative dim"
                )
            nbytes = tensor_bytes(info.shape, info.dtype.itemsize)
            if not budget.fits(nbytes):
                budget.claim(nbytes, f"output {out.index} {info} of layer {layer.name!r} ({layer.kind})")


def claim_arenas(budget: MemoryBudget, plans: Mapping[str, Any], order: Iterable[Any], pools: int) -> None:
    """Claim ``pools`` times the arenas of ``plans`` ({backend: MemoryPlan}) before they are
    allocated; the error names the layer with the largest tensor (``order``: the dataflow's
    workload nodes, each with ``layer``, ``kind`` and ``outputs`` tensor ids)."""
    arenas = {backend: plan.arena_bytes for backend, plan in plans.items()}
    total = pools * sum(arenas.values())
    if budget.fits(total):
        budget.used += total
        return
    sizes = {tid: p.nbytes for plan in plans.values() for tid, p in plan.placements.items()}
    biggest = max(
        ((sizes.get(t, 0), node) for node in order for t in node.outputs if t is not None),
        key=lambda pair: pair[0],
        default=(0, None),
    )
    largest = (
        ""
        if biggest[1] is None
        else (
            f"; the largest tensor, {biggest[0]:,} bytes, is the output of layer {biggest[1].layer!r} "
            f"({biggest[1].kind})"
        )
    )
    detail = ", ".join(f"{b} {n:,} bytes" for b, n in arenas.items())
    budget.claim(
        total,
        f"the working memory of the network ({pools:,} memory pool(s) of arenas: {detail}{largest}; "
        "one pool per run in flight, as many as Runtime.load's max_in_flight)",
    )


__all__ = [
    "DEFAULT_FRACTION",
    "MemoryBudget",
    "check_layer_outputs",
    "check_memory_budget",
    "claim_arenas",
    "default_memory_budget",
    "physical_memory",
    "tensor_bytes",
]
