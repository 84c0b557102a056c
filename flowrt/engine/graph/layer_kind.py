"""Layer kinds: what each kind of layer is called, its descriptor, and its shape inference.

A layer kind is registered once, by name (the ONNX op type where the concept is ONNX's),
in one small module under ``flowrt/engine/graph/layers/``. Backends say per kind whether
they support it; the front ends and the Python builder create layers by kind name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from flowrt.errors import GraphError
from flowrt.types import TensorInfo

# infer(descriptor, input infos, constant input values) -> output infos.
# An input info is None when an optional input is absent; a constant value is the array
# when that input is produced by a Constant layer, else None.
InferFn = Callable[[Any, Sequence["TensorInfo | None"], Sequence["np.ndarray | None"]], list[TensorInfo]]


@attrs.frozen
class NoDescriptor:
    """Descriptor of a layer kind that has no attributes."""


@attrs.frozen
class LayerKind:
    """One kind of layer.

    ``min_inputs``/``max_inputs`` bound the input slots (``max_inputs=None``: variadic);
    ``num_outputs`` is the default number of outputs (``None``: decided by the descriptor,
    and the infer function returns as many infos as there are outputs).
    """

    name: str
    descriptor: type
    infer: InferFn
    min_inputs: int = 1
    max_inputs: int | None = 1
    num_outputs: int | None = 1


# Filled as the modules of ``flowrt.engine.graph.layers`` are imported; complete once
# ``_register_all`` ran (the look-ups below run it first).
LAYER_KINDS: dict[str, LayerKind] = {}
_all_registered = False


def layer_kind(
    name: str | Sequence[str],
    descriptor: type = NoDescriptor,
    *,
    min_inputs: int = 1,
    max_inputs: int | None = 1,
    num_outputs: int | None = 1,
) -> Callable[[InferFn], InferFn]:
    """Register the decorated infer function for one or several layer kind names."""
    names = [name] if isinstance(name, str) else list(name)

    def register(infer: InferFn) -> InferFn:
        for n in names:
            if n in LAYER_KINDS:
                raise GraphError(f"layer kind {n!r} registered twice")
            LAYER_KINDS[n] = LayerKind(n, descriptor, infer, min_inputs, max_inputs, num_outputs)
        return infer

    return register


def _register_all() -> None:
    """Register every kind (the first time): the layers package does not when imported."""
    global _all_registered
    if not _all_registered:
        from flowrt.engine.graph.layers import register_all

        register_all()
        _all_registered = True


def get_layer_kind(name: str) -> LayerKind:
    """The registered kind called ``name``; raises KeyError when there is none."""
    kind = LAYER_KINDS.get(name)
    if kind is None:
        _register_all()
        return LAYER_KINDS[name]
    return kind


def known_layer_kinds() -> list[str]:
    """Every registered kind's name, sorted."""
    _register_all()
    return sorted(LAYER_KINDS)


def as_tuple(value: Any) -> tuple | None:
    """Converter for descriptor fields holding a list: None stays None, anything else a tuple."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return tuple(value.tolist())
    return tuple(value)
