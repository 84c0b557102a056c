"""Layer kinds: what each kind of layer is called, its descriptor, its shape inference and
the facts the engine and backends ask of it.

A layer kind is registered once, by name (the ONNX op type where the concept is ONNX's),
in one small module under ``flowrt/engine/graph/layers/``. Backends say per kind whether
they support it; the front ends and the Python builder create layers by kind name.

An activation declares its :class:`ActivationFact` where its kind is registered
(``layer_kind(..., activation=ActivationFact(...))``): its code in the backends' ``activate()``
switches and how its descriptor gives the ``alpha`` and ``beta`` those take. That is the one
activation table: the fuse passes, ``FusedActivation``'s check, CpuAcc's epilogue and GpuAcc's
codes all read it (:func:`activation_facts`, :func:`activation_kinds`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import attrs
import numpy as np

from flowrt.errors import GraphError
from flowrt.registry.protocols import FusedActivation, set_fusable_activation_kinds
from flowrt.types import TensorInfo

# infer(descriptor, input infos, constant input values) -> output infos.
# An input info is None when an optional input is absent; a constant value is the array
# when that input is produced by a Constant layer, else None.
InferFn = Callable[[Any, Sequence["TensorInfo | None"], Sequence["np.ndarray | None"]], list[TensorInfo]]


@attrs.frozen
class NoDescriptor:
    """Descriptor of a layer kind that has no attributes."""


# (descriptor, constant input values) -> (alpha, beta) for activate(); None where this layer
# cannot be a fused activation (Clip's bounds not constants).
ActivationParams = Callable[[Any, Sequence[Any]], tuple[float, float] | None]
# Who fuses an activation into the layer before it: every backend that fuses activations
# (capability ``fused_activation``; the engine's pass fuses these), only a backend that offers
# it through its own ``optimize_subgraph`` (CpuAcc's curves), or none (only the kind's own
# Activation kernels use its code).
Fused = Literal["everywhere", "curve", "never"]
# activate()'s code for no activation; an activation's code is 1 or more.
NO_ACTIVATION = 0


def no_params(descriptor: Any, constants: Sequence[Any]) -> tuple[float, float]:
    """``(alpha, beta)`` of an activation that takes neither."""
    return 0.0, 0.0


def plain_form(descriptor: Any) -> str:
    """The form of an activation that has one: the plain one, ``""``."""
    return ""


@attrs.frozen
class ActivationFact:
    """What an activation kind is to the kernels that apply it as they store a value.

    ``code`` is its case in every backend's ``activate(v, code, alpha, beta)`` switch (CpuAcc's
    ``kernels/epilogue.py``, GpuAcc's ``kernels/common.cl``). Codes are compiled into cached
    kernels (numba's cache, OpenCL binaries): a code once given is never changed, and a new
    activation takes the next free one. ``params`` gives its ``alpha`` and ``beta`` from a
    layer's descriptor and constant inputs; ``fused`` says who fuses it (see ``Fused``).
    ``variants`` are the codes of the kind's other forms, by name (Gelu's "tanh"), and ``form``
    names a layer's form from its descriptor (``""``: the plain one, ``code``).
    """

    code: int = attrs.field(validator=attrs.validators.ge(1))
    params: ActivationParams = no_params
    fused: Fused = attrs.field(
        default="everywhere", validator=attrs.validators.in_(("everywhere", "curve", "never"))
    )
    variants: Mapping[str, int] = attrs.field(factory=dict, hash=False)
    form: Callable[[Any], str] = plain_form

    def code_of(self, form: str) -> int:
        """The code of the kind's form ``form`` (``""``: the plain one)."""
        return self.variants[form] if form else self.code


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

    @property
    def activation(self) -> ActivationFact | None:
        """This kind's entry in the activation table; None when it is no activation."""
        return ACTIVATIONS.get(self.name)


# Filled as the modules of ``flowrt.engine.graph.layers`` are imported: a look-up by name
# imports the module that registers the kind (``layers.KIND_MODULES``), and the listing of
# every kind imports them all.
LAYER_KINDS: dict[str, LayerKind] = {}
# The module that registered each kind (what ``layers.KIND_MODULES`` is checked against).
REGISTERED_BY: dict[str, str] = {}
# The activation table, by kind: filled with LAYER_KINDS, complete once the modules of
# ``layers.ACTIVATION_MODULES`` are imported (the look-ups below import them first).
ACTIVATIONS: dict[str, ActivationFact] = {}
_all_registered = False


def layer_kind(
    name: str | Sequence[str],
    descriptor: type = NoDescriptor,
    *,
    min_inputs: int = 1,
    max_inputs: int | None = 1,
    num_outputs: int | None = 1,
    activation: ActivationFact | None = None,
) -> Callable[[InferFn], InferFn]:
    """Register the decorated infer function for one or several layer kind names;
    ``activation`` (one name only) enters the kind in the activation table."""
    names = [name] if isinstance(name, str) else list(name)
    if activation is not None and len(names) != 1:
        raise GraphError(f"an activation fact is one kind's, not {names}'s")
    module = sys._getframe(1).f_globals.get("__name__", "")

    def register(infer: InferFn) -> InferFn:
        for n in names:
            if n in LAYER_KINDS:
                raise GraphError(f"layer kind {n!r} registered twice")
            if activation is not None:
                declare_activation(n, activation)
            LAYER_KINDS[n] = LayerKind(n, descriptor, infer, min_inputs, max_inputs, num_outputs)
            REGISTERED_BY[n] = module
        return infer

    return register


def declare_activation(name: str, fact: ActivationFact) -> None:
    """Enter kind ``name`` in the activation table; GraphError where the kind is in it already
    or one of its codes is another activation's. ``layer_kind(..., activation=fact)`` calls
    this; a module calls it itself only for a kind registered elsewhere."""
    if name in ACTIVATIONS:
        raise GraphError(f"activation {name!r} declared twice")
    owner = {code: kind for kind, f in ACTIVATIONS.items() for code in (f.code, *f.variants.values())}
    owner[NO_ACTIVATION] = "no activation"
    codes = [fact.code, *fact.variants.values()]
    for code in codes:
        if code in owner or codes.count(code) > 1:
            raise GraphError(f"activation {name!r} takes code {code}, which is {owner.get(code, name)!r}'s")
    ACTIVATIONS[name] = fact


def activation_facts() -> dict[str, ActivationFact]:
    """The activation table: every activation kind's fact, in code order."""
    from flowrt.engine.graph.layers import register_activations

    register_activations()
    return dict(sorted(ACTIVATIONS.items(), key=lambda item: item[1].code))


def activation_kinds(*fused: Fused) -> tuple[str, ...]:
    """The activation kinds whose ``fused`` is one of ``fused``, in code order:
    ``activation_kinds("everywhere")`` are those every backend that fuses activations applies."""
    return tuple(kind for kind, fact in activation_facts().items() if fact.fused in fused)


def activation_code(activation: FusedActivation) -> int:
    """The code of ``activation`` in every backend's ``activate()``: its kind's, or its form's."""
    return activation_facts()[activation.kind].code_of(activation.form)


# FusedActivation (in the registry, which may not import this room) names these kinds and
# forms only.
set_fusable_activation_kinds(
    lambda: activation_kinds("everywhere", "curve"), lambda kind: tuple(activation_facts()[kind].variants)
)


def _register_all() -> None:
    """Register every kind (the first time): the layers package does not when imported."""
    global _all_registered
    if not _all_registered:
        from flowrt.engine.graph.layers import register_all

        register_all()
        _all_registered = True


def get_layer_kind(name: str) -> LayerKind:
    """The registered kind called ``name``; raises KeyError when there is none. Imports the
    module that registers it where that has not happened yet (the descriptors are attrs
    classes, some seventy in all, whose making costs tens of milliseconds: a network's load
    makes those of its kinds only)."""
    kind = LAYER_KINDS.get(name)
    if kind is None:
        from flowrt.engine.graph.layers import register_kind

        register_kind(name)
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
