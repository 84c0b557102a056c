"""Attention's layers fused, for a backend that offers these among its patterns (GpuAcc):

- its scores scaled, masked and normalized as one layer: ``Softmax(X * scale + mask)`` along
  the last axis -> ``AttentionSoftmax`` (``softmax(scale * X + mask)``; one row kernel
  instead of three launches). Exporters write the scale as ``Mul`` by a constant or ``Div``
  by one, on either side (read as a :class:`~flowrt.engine.graph.passes.pattern_match.Monomial`);
  the mask is any float tensor that broadcasts to the scores' shape (BERT's padding mask,
  GPT's and LLaMA's causal one); a Softmax after the scale alone, or after the mask alone, is
  fused too;
- its head splits read in place: a MatMul of tensors (not of constant weights) one or both
  of which a Transpose makes, or a Mul by a constant scales, read by that MatMul only ->
  ``TransposedMatMul``, which reads the Transposes' inputs through permuted strides (Q K^T
  and P V straight from the (batch, seq, heads, depth) tensors the projections' Reshapes
  give; no transpose pass) and applies the scales as its alpha;
- its rotary position embedding as exported from Hugging Face's LLaMA, ``X * cos +
  concat(-X[..., D/2:], X[..., :D/2]) * sin`` (Slice, Slice, Neg, Concat, Mul, Mul, Add, in
  any operand order) -> ``ApplyRotary(X, cos, sin)``, reading X through the Transpose
  before it (the heads-first split) where only the rotation reads it.
"""

from __future__ import annotations

from flowrt.engine.graph.graph import Layer, OutputSlot, constant_value
from flowrt.engine.graph.layers.gemm import TransposedMatMulDescriptor
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.graph.layers.rotary import ApplyRotaryDescriptor
from flowrt.engine.graph.layers.slice import slice_params
from flowrt.engine.graph.layers.softmax import AttentionSoftmaxDescriptor
from flowrt.engine.graph.layers.transpose import transpose_perm
from flowrt.engine.graph.passes.fusions import Fusion
from flowrt.engine.graph.passes.pattern_match import (
    Monomial,
    accept,
    monomial,
    other_operand,
    producer,
    sources,
)
from flowrt.errors import ShapeError
from flowrt.registry import ReplacementLayer
from flowrt.types import DataType


def _scores(slot: OutputSlot | None, members: set[str]) -> Monomial | None:
    """``slot`` read as ``scale * X``, else None."""
    read = monomial(slot, members)
    return read if len(read.num) == 1 and not read.den and read.num[0] is not None else None


def _on_last_axis(softmax: Layer) -> bool:
    info = softmax.outputs[0].info if softmax.outputs else None
    if info is None or info.shape is None or len(info.shape) == 0:
        return False
    rank = len(info.shape)
    try:
        return softmax.descriptor.resolved_axis(rank, "Softmax") == rank - 1
    except ShapeError:  # an axis out of range: the layer's own check reports it
        return False


def attention_softmax(layer: Layer, members: set[str]) -> Fusion | None:
    """Softmax (last axis) of ``scale * X + mask``, ``scale * X`` or ``X + mask`` -> one
    AttentionSoftmax reading X and the mask."""
    if layer.kind != "Softmax" or layer.activation is not None or not _on_last_axis(layer):
        return None
    below = sources(layer)[0]
    add = producer(below, members, "Add")
    if add is None:
        read = _scores(below, members)
        if read is None or not read.layers:
            return None  # a plain Softmax
        return _fusion([*read.layers], layer, read, None, members)
    if len(add.inputs) != 2 or add.activation is not None:
        return None
    a, b = sources(add)
    candidates = [(_scores(x, members), mask) for x, mask in ((a, b), (b, a))]
    # The operand that is a product is the scores; else either may be (a mask of X's shape).
    candidates.sort(key=lambda c: c[0] is None or not c[0].layers)
    for read, mask in candidates:
        if read is not None and mask is not None:
            fusion = _fusion([*read.layers, add], layer, read, mask, members)
            if fusion is not None:
                return fusion
    return None


def _fusion(
    layers: list[Layer], softmax: Layer, read: Monomial, mask: OutputSlot | None, members: set[str]
) -> Fusion | None:
    if any(other.activation is not None for other in layers):
        return None
    replacement = ReplacementLayer(
        "AttentionSoftmax",
        AttentionSoftmaxDescriptor(float(read.scale)),
        (read.num[0], mask),
        None,
        softmax.name,
    )
    return accept([*layers, softmax], softmax, replacement, members)


def _scaled(slot: OutputSlot, members: set[str]) -> tuple[float, OutputSlot, list[Layer]]:
    """``slot`` read as ``scale * X`` (Muls and Divs by constants that only the next reads),
    as (scale, X, those layers); (1, slot, []) where it is not one."""
    read = _scores(slot, members)
    if read is not None and read.layers and len(slot.connections) == 1:
        if all(len(layer.outputs[0].connections) == 1 for layer in read.layers):
            return read.scale, read.num[0], list(read.layers)
    return 1.0, slot, []


def _transpose_under(slot: OutputSlot, members: set[str]) -> tuple[Layer, tuple[int, ...]] | None:
    """(the Transpose making ``slot``, its permutation) where one in the view does and its
    input's rank is known, else None."""
    transpose = producer(slot, members, "Transpose")
    info = transpose.input_infos[0] if transpose is not None else None
    if transpose is None or info is None or info.shape is None or transpose.activation is not None:
        return None
    return transpose, tuple(transpose_perm(transpose.descriptor.perm, len(info.shape)))


def _transpose_over(layer: Layer, members: set[str]) -> tuple[Layer, tuple[int, ...]] | None:
    """(the Transpose that alone reads ``layer``'s output, its permutation) where one in the
    view does and the output's rank is known, else None."""
    out = layer.outputs[0]
    info = out.info
    if len(out.connections) != 1 or info is None or info.shape is None:
        return None
    reader = out.connections[0].layer
    if reader.kind != "Transpose" or reader.name not in members or reader.activation is not None:
        return None
    return reader, tuple(transpose_perm(reader.descriptor.perm, len(info.shape)))


def transposed_matmul(layer: Layer, members: set[str]) -> Fusion | None:
    """MatMul of tensors, each maybe scaled by a constant and maybe made by a Transpose, where
    only it reads them, and maybe read by a Transpose alone -> one TransposedMatMul reading the
    Transposes' inputs with their permutations and writing its product permuted as the
    Transpose after it would, the scales its alpha (ViT's attention scales Q and K before their
    product; every exporter's P V is transposed back to (batch, seq, heads, depth) before the
    heads merge)."""
    if layer.kind != "MatMul" or layer.activation is not None or len(layer.inputs) != 2:
        return None
    slots = sources(layer)
    if any(slot is None or constant_value(slot) is not None for slot in slots):
        return None  # a product by weights: matmul_add's and matmul_residual's
    perms: list[tuple[int, ...] | None] = []
    reads: list[OutputSlot | None] = []
    fused: list[Layer] = []
    alpha = 1.0
    for slot in slots:
        assert slot is not None  # checked above
        scale, slot, scaling = _scaled(slot, members)
        alpha *= scale
        fused += scaling
        under = _transpose_under(slot, members)
        if under is None or len(slot.connections) != 1:
            perms.append(None)
            reads.append(slot)
            continue
        transpose, perm = under
        perms.append(perm)
        reads.append(transpose.inputs[0].source)
        fused.append(transpose)
    over = _transpose_over(layer, members)
    out = layer.outputs[0].info
    if (not fused and over is None) or out is None or out.dtype is not DataType.FLOAT32:
        return None
    after = [over[0]] if over is not None else []
    infos = [f.outputs[0].info for f in (*fused, *after)]
    if any(f.activation is not None for f in fused) or any(
        i is None or i.dtype is not DataType.FLOAT32 for i in infos
    ):
        return None
    descriptor = TransposedMatMulDescriptor(perms[0], perms[1], alpha, over[1] if over is not None else None)
    replacement = ReplacementLayer("TransposedMatMul", descriptor, tuple(reads), None, layer.name)
    return [*fused, layer, *after], replacement


def _slice_range(layer: Layer, rank: int, length: int) -> tuple[int, int] | None:
    """[start, end) that a Slice of constant parameters takes along the last axis (of
    ``length`` values, in a tensor of ``rank``), clamped as ONNX clamps; None for any other."""
    try:
        params = slice_params(
            layer.descriptor, [const_ints(constant_value(s.source)) for s in layer.inputs[1:]]
        )
    except ShapeError:
        return None
    if params is None or len(params[0]) != 1 or params[3] != [1] or params[2][0] % rank != rank - 1:
        return None
    start, end = (v + length if v < 0 else v for v in (params[0][0], params[1][0]))
    return min(max(start, 0), length), min(max(end, 0), length)


def _rotate_half(slot: OutputSlot | None, members: set[str]) -> tuple[OutputSlot, list[Layer]] | None:
    """(X, the layers) where ``slot`` is ``concat(-X[..., D/2:], X[..., :D/2])`` along the last
    axis, else None."""
    concat = producer(slot, members, "Concat")
    if concat is None or len(concat.inputs) != 2:
        return None
    neg = producer(concat.inputs[0].source, members, "Neg")
    low = producer(concat.inputs[1].source, members, "Slice")
    high = producer(neg.inputs[0].source, members, "Slice") if neg is not None else None
    if neg is None or low is None or high is None or high.inputs[0].source is not low.inputs[0].source:
        return None
    x = low.inputs[0].source
    shape = x.info.shape if x is not None and x.info is not None else None
    if x is None or not shape or not isinstance(shape[-1], int) or shape[-1] % 2:
        return None
    rank, length = len(shape), shape[-1]
    if concat.descriptor.axis is None or concat.descriptor.axis % rank != rank - 1:
        return None
    half = length // 2
    if _slice_range(high, rank, length) != (half, length) or _slice_range(low, rank, length) != (0, half):
        return None
    return x, [high, low, neg, concat]


def apply_rotary(layer: Layer, members: set[str]) -> Fusion | None:
    """``X * cos + rotate_half(X) * sin`` (each product's operands, and the sum's, in either
    order) -> one ApplyRotary(X, cos, sin)."""
    if layer.kind != "Add" or len(layer.inputs) != 2 or layer.activation is not None:
        return None
    a, b = sources(layer)
    for plain_slot, mixed_slot in ((a, b), (b, a)):
        plain, mixed = producer(plain_slot, members, "Mul"), producer(mixed_slot, members, "Mul")
        if plain is None or mixed is None:
            continue
        m0, m1 = sources(mixed)
        for rotated, sin in ((m0, m1), (m1, m0)):
            found = _rotate_half(rotated, members)
            cos = other_operand(plain, found[0]) if found is not None else None
            if found is None or cos is None or sin is None:
                continue
            x, layers = found
            replacement = ReplacementLayer(
                "ApplyRotary", ApplyRotaryDescriptor(), (x, cos, sin), None, layer.name
            )
            fusion = accept([*layers, plain, mixed, layer], layer, replacement, members)
            if fusion is not None:
                return _through_transpose(fusion, x, members)
    return None


def _through_transpose(fusion: Fusion, x: OutputSlot, members: set[str]) -> Fusion:
    """``fusion`` reading X's Transpose's input with its perm where only the fused layers read
    X and the Transpose keeps the last axis last (LLaMA transposes Q and K to heads first
    right before their rotation); else as it is."""
    layers, replacement = fusion
    under = _transpose_under(x, members)
    names = {layer.name for layer in layers}
    if under is None:
        return fusion
    transpose, perm = under
    if perm[-1] != len(perm) - 1 or any(d.layer.name not in names for d in x.connections):
        return fusion
    source = transpose.inputs[0].source
    inputs = (source, *replacement.inputs[1:])
    moved = ReplacementLayer(
        replacement.kind, ApplyRotaryDescriptor(perm), inputs, replacement.activation, replacement.name
    )
    return [transpose, *layers], moved


# Every finder of this module, for a backend's ``offer_fusions`` patterns.
ATTENTION_FUSIONS = (attention_softmax, transposed_matmul, apply_rotary)
