"""Reading small-op patterns back into the formula they compute: the helpers of the pattern
fusions (``pattern_fusions``, ``norm_fusions``).

Exporters write one formula in many orders: ``x * 0.5 * a``, ``(x * a) * 0.5``,
``x * (a * 0.5)``; ``u / sqrt(v)``, ``u * Reciprocal(sqrt(v))``, ``u * (1 / sqrt(v))``;
``Pow(u, 2)`` or ``u * u``. A :class:`Monomial` reads the tree of Mul, Div, Reciprocal and
small integer Pow layers under a tensor as ``scale * prod(num) / prod(den)``, so that one
check covers them all. A match is then made a fusion only by :func:`accept`, which holds the
conditions every pattern shares.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs
import numpy as np

from flowrt.engine.graph.graph import Layer, OutputSlot, constant_value
from flowrt.engine.graph.passes.fusions import Fusion
from flowrt.registry import ReplacementLayer
from flowrt.types import DataType

# Pow(u, n) is read as a product for these exponents (x^2 in norms, x^3 in tanh-GELU).
POWERS = (2, 3, 4)
_PRODUCT_KINDS = ("Mul", "Div", "Reciprocal", "Pow")


def close(value: float | None, expected: float) -> bool:
    """Whether a constant read from the graph is ``expected`` (float32-rounded exporters' values)."""
    return value is not None and bool(np.isclose(value, expected))


def scalar(slot: OutputSlot | None) -> float | None:
    """The value of a one-element numeric constant at ``slot``, else None."""
    value = constant_value(slot)
    if value is None or value.size != 1 or not np.issubdtype(value.dtype, np.number):
        return None
    return float(value.reshape(-1)[0])


def producer(slot: OutputSlot | None, members: set[str], *kinds: str) -> Layer | None:
    """The layer producing ``slot`` when it is of one of ``kinds``, in the view (``members``)
    and not a pre-opset-7 broadcast; else None."""
    if slot is None or slot.layer.kind not in kinds or slot.layer.name not in members:
        return None
    return None if getattr(slot.layer.descriptor, "legacy", False) else slot.layer


def sources(layer: Layer) -> list[OutputSlot | None]:
    """The slots ``layer`` reads, in input order."""
    return [s.source for s in layer.inputs]


def other_operand(layer: Layer, known: OutputSlot) -> OutputSlot | None:
    """The other input of a two-input ``layer`` one of whose inputs is ``known``."""
    a, b = (sources(layer) + [None, None])[:2]
    if len(layer.inputs) != 2:
        return None
    return b if a is known else a if b is known else None


@attrs.frozen
class Monomial:
    """``scale * prod(num) / prod(den)``, read from ``layers`` (the root last)."""

    scale: float
    num: tuple[OutputSlot, ...] = ()
    den: tuple[OutputSlot, ...] = ()
    layers: tuple[Layer, ...] = ()

    def times(self, other: Monomial) -> Monomial:
        """``self * other``."""
        return Monomial(
            self.scale * other.scale, self.num + other.num, self.den + other.den, self.layers + other.layers
        )

    def inverse(self) -> Monomial | None:
        """``1 / self``; None when the scale is zero."""
        if self.scale == 0:
            return None
        return Monomial(1 / self.scale, self.den, self.num, self.layers)

    def power(self, n: int) -> Monomial:
        """``self ** n``."""
        return Monomial(self.scale**n, self.num * n, self.den * n, self.layers)

    def is_power(self, slot: OutputSlot, n: int, scale: float = 1.0) -> bool:
        """Whether this is ``scale * slot ** n``."""
        return not self.den and self.num == (slot,) * n and close(self.scale, scale)


def _read(layer: Layer, members: set[str]) -> Monomial | None:
    """The product ``layer`` computes from its inputs, or None when it is no product."""
    a, b = (sources(layer) + [None])[:2]
    if layer.kind == "Mul":
        return monomial(a, members, False).times(monomial(b, members, False))
    if layer.kind == "Pow":
        n = scalar(b)
        return monomial(a, members, False).power(int(n)) if n in POWERS else None
    inverse = monomial(b if layer.kind == "Div" else a, members, False).inverse()
    if inverse is None:
        return None
    return monomial(a, members, False).times(inverse) if layer.kind == "Div" else inverse


def monomial(slot: OutputSlot | None, members: set[str], top: bool = True) -> Monomial:
    """``slot`` read as a product of the tensors under it.

    Only layers of the view are read, and below ``top`` only those whose output is read once
    (a tensor read twice is a leaf: it is the pattern's input or shared with other work).
    One-element constants multiply into ``scale``.
    """
    value = scalar(slot)
    if value is not None:
        return Monomial(value)
    layer = producer(slot, members, *_PRODUCT_KINDS)
    if slot is not None and layer is not None and (top or len(slot.connections) == 1):
        read = _read(layer, members)
        if read is not None:
            return attrs.evolve(read, layers=read.layers + (layer,))
    return Monomial(1.0, (slot,))  # type: ignore[arg-type]  # an absent slot (None) is a factor no pattern matches


def accept(
    layers: Iterable[Layer], root: Layer, replacement: ReplacementLayer, members: set[str]
) -> Fusion | None:
    """The fusion of ``layers`` into ``replacement`` (whose first input is the pattern's X), or
    None unless it is safe: every layer is in the view with one float32 output, every one
    but ``root`` is read only by the others (nothing outside needs an intermediate), the
    replacement reads only tensors produced outside them, and ``root`` outputs X's shape and
    type (no constant broadcast the result to a larger shape)."""
    unique = {layer.name: layer for layer in layers if layer is not root}
    ordered = [*unique.values(), root]
    names = {layer.name for layer in ordered}
    for layer in ordered:
        if layer.name not in members or len(layer.outputs) != 1:
            return None
        out = layer.outputs[0]
        if out.info is None or out.info.dtype is not DataType.FLOAT32:
            return None
        if layer is not root and any(d.layer.name not in names for d in out.connections):
            return None
    if any(s is not None and s.layer.name in names for s in replacement.inputs):
        return None
    x = replacement.inputs[0]
    if x is None or x.info != root.outputs[0].info:
        return None
    return ordered, replacement
