"""Fusions a backend offers through ``optimize_subgraph``: patterns found in the subgraph it
is handed, each answered as a substitution by one fused layer (Arm NN's backend-side
``FuseLayer`` optimizations).

- ``MatMul`` of two matrices + ``Add`` of a constant bias (+ an activation) -> one ``Gemm``
  (with the activation fused), as ONNX Runtime's MatMulAddFusion; of a batch or sequence of
  rows by a matrix + a constant vector along its columns -> one ``MatMulBias``;
- a layer of ``activation_kinds`` (Conv, Gemm, ...) + the activation reading it -> that
  layer with the activation fused (Conv + bias + Relu is one Conv);
- Conv + a residual Add (+ an activation) -> one ``FusedConv``, where a backend passes
  :func:`conv_residual` among its patterns (GpuAcc adds Z in its GEMM's epilogue), and MatMul
  or MatMulBias + a residual Add -> one ``MatMulBias`` with Z (:func:`matmul_residual`), and
  a Gemm on a sequence's rows between two Reshapes -> one ``MatMulBias`` of the sequence, with
  the residual Add or activation after it (:func:`gemm_on_rows`);
- the ``patterns`` a backend passes, tried first (CpuAcc's ``PATTERN_FUSIONS``: SiLU, GELU,
  HardSwish, LayerNormalization and RMSNormalization written out of small ops -> one layer).

A backend calls :func:`offer_fusions` with its own layer support, so only fused layers it can
run are offered; every layer not fused is answered untouched. Activations are fused only while
the view's options allow it (``OptimizerOptions.fuse_activations``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence

import numpy as np

from flowrt.engine.graph import layer_kind
from flowrt.engine.graph.graph import Layer, OutputSlot, constant_value
from flowrt.engine.graph.layer_kind import NoDescriptor
from flowrt.engine.graph.layers.gemm import GemmDescriptor
from flowrt.engine.graph.passes.fuse_activation import as_fused_activation
from flowrt.registry import FusedActivation, LayerSupport, OptimizationViews, ReplacementLayer
from flowrt.types import DataType, static_dims

Fusion = tuple[list[Layer], ReplacementLayer]

# The kinds whose kernels apply a fused activation as they store their result, on both built-in
# accelerated backends (CpuAcc's numba epilogues, GpuAcc's activate()): the ``activation_kinds``
# each passes to :func:`offer_fusions`. Other kinds would need a pass more.
EPILOGUE_ACTIVATION_KINDS = frozenset(
    {
        "Conv",
        "FusedConv",
        "Gemm",
        "MatMul",
        "MatMulBias",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Sum",
        "BatchNormalization",
    }
)


def _only_reader(layer: Layer, members: set[str]) -> Layer | None:
    """The one layer of the subgraph reading ``layer``'s only output, float32, if so."""
    if len(layer.outputs) != 1 or len(layer.outputs[0].connections) != 1:
        return None
    info = layer.outputs[0].info
    reader = layer.outputs[0].connections[0].layer
    if info is None or info.dtype is not DataType.FLOAT32 or reader.name not in members:
        return None
    return reader


def _activation_of(layer: Layer | None, activations: Collection[str] | None) -> FusedActivation | None:
    """``layer`` as a FusedActivation when it is one of ``activations`` (None: those every
    backend that fuses activations applies) with constant parameters."""
    if activations is None:
        activations = layer_kind.activation_kinds("everywhere")
    if layer is None or layer.kind not in activations:
        return None
    constants = tuple(constant_value(s.source) for s in layer.inputs)
    if any(s.source is not None and c is None for s, c in zip(layer.inputs[1:], constants[1:])):
        return None
    return as_fused_activation(layer.kind, layer.descriptor, constants)


def _bias_of(add: Layer, product: Layer) -> np.ndarray | None:
    """The constant ``add`` adds to ``product``'s (M, N) output, when it broadcasts to (M, N)."""
    if add.kind != "Add" or len(add.inputs) != 2 or getattr(add.descriptor, "legacy", False):
        return None
    slots = [s.source for s in add.inputs]
    other = slots[1] if slots[0] is product.outputs[0] else slots[0]
    bias, info = constant_value(other), product.outputs[0].info
    if bias is None or bias.dtype != np.float32 or bias.ndim > 2:
        return None
    if info is None or not info.is_static:
        return None  # a symbolic dim: whether the bias grows the output is not known
    shape = static_dims(info.shape)
    try:
        return bias if np.broadcast_shapes(bias.shape, shape) == shape else None
    except ValueError:
        return None


def _is_column_vector(add: Layer, product: Layer, columns) -> bool:
    """Whether ``add`` adds to ``product``'s output a constant float32 vector of ``columns``."""
    if add.kind != "Add" or len(add.inputs) != 2 or getattr(add.descriptor, "legacy", False):
        return False
    slots = [s.source for s in add.inputs]
    bias = constant_value(slots[1] if slots[0] is product.outputs[0] else slots[0])
    return bias is not None and bias.dtype == np.float32 and bias.shape == (columns,)


def matmul_add(
    layer: Layer,
    members: set[str],
    activation_kinds: frozenset[str] = frozenset(),
    activations: Collection[str] | None = None,
) -> Fusion | None:
    """MatMul (matrices) + Add (constant bias) [+ activation] -> Gemm; MatMul (A of any
    other rank by a matrix) + Add (a constant vector along the columns) -> MatMulBias.
    The activation is fused where the resulting kind is one of ``activation_kinds``."""
    shapes = [None if i is None else i.shape for i in layer.input_infos]
    a, b = (shapes + [None, None])[:2]
    if layer.kind != "MatMul" or a is None or b is None or len(b) != 2:
        return None
    kind = "Gemm" if len(a) == 2 else "MatMulBias"
    add = _only_reader(layer, members)
    if add is None:
        return None
    if kind == "Gemm" and _bias_of(add, layer) is None:
        return None
    if kind == "MatMulBias" and not _is_column_vector(add, layer, b[1]):
        return None
    bias_slot = next(s.source for s in add.inputs if s.source is not layer.outputs[0])
    after = _only_reader(add, members)
    activation = _activation_of(after, activations) if kind in activation_kinds else None
    fused = [layer, add] if after is None or activation is None else [layer, add, after]
    sources = (layer.inputs[0].source, layer.inputs[1].source, bias_slot)
    descriptor = GemmDescriptor() if kind == "Gemm" else NoDescriptor()
    return fused, ReplacementLayer(kind, descriptor, sources, activation, layer.name)


def conv_residual(
    layer: Layer, members: set[str], activations: Collection[str] | None = None
) -> Fusion | None:
    """Conv + Add of a tensor of the Conv's output shape (a residual connection) [+ the
    activation] -> one FusedConv (``act(Conv(X, W, B) + Z)``). A backend offers it by passing
    this among its ``patterns``."""
    if layer.kind != "Conv" or layer.activation is not None:
        return None
    found = _with_residual(layer, members, activations)
    if found is None:
        return None
    fused, z, activation = found
    x, w, *bias = (s.source for s in layer.inputs)
    sources = (x, w, bias[0] if bias else None, z)
    return fused, ReplacementLayer("FusedConv", layer.descriptor, sources, activation, layer.name)


def _with_residual(
    layer: Layer, members: set[str], activations: Collection[str] | None
) -> tuple[list[Layer], OutputSlot, FusedActivation | None] | None:
    """(the layers fused, Z, the activation) where ``layer``'s only reader is an Add of a
    tensor Z of ``layer``'s output shape and type (a residual connection; a broadcast Add is
    not one), the activation the Add's own or that of the layer reading it (then fused too)."""
    add = _only_reader(layer, members)
    if add is None or add.kind != "Add" or len(add.inputs) != 2 or getattr(add.descriptor, "legacy", False):
        return None
    out = layer.outputs[0]
    z = next((s.source for s in add.inputs if s.source is not out), None)
    info = out.info
    if z is None or z.info is None or info is None or not info.is_static:
        return None
    if z.info.dtype is not DataType.FLOAT32 or z.info.shape != info.shape or add.outputs[0].info != info:
        return None
    activation, fused = add.activation, [layer, add]
    if activation is None:
        after = _only_reader(add, members)
        activation = _activation_of(after, activations)
        if after is not None and activation is not None:
            fused.append(after)
    return fused, z, activation


def matmul_residual(
    layer: Layer, members: set[str], activations: Collection[str] | None = None
) -> Fusion | None:
    """MatMul or MatMulBias (A by a matrix) + Add of a tensor of its output's shape (a
    transformer's residual connection) [+ the activation] -> one MatMulBias with that tensor
    as its Z (``act(A @ B + bias + Z)``, the bias absent after a MatMul). A backend offers it
    by passing this among its ``patterns``."""
    if layer.kind not in ("MatMul", "MatMulBias") or layer.activation is not None or len(layer.inputs) > 3:
        return None
    b = layer.input_infos[1] if len(layer.inputs) > 1 else None
    if b is None or b.shape is None or len(b.shape) != 2:
        return None
    found = _with_residual(layer, members, activations)
    if found is None:
        return None
    fused, z, activation = found
    bias = layer.inputs[2].source if layer.kind == "MatMulBias" else None
    sources = (layer.inputs[0].source, layer.inputs[1].source, bias, z)
    return fused, ReplacementLayer("MatMulBias", NoDescriptor(), sources, activation, layer.name)


def _rows_view(reshape: Layer | None, members: set[str]) -> tuple[int, ...] | None:
    """The static shape of a Reshape's input where it only folds the leading dims into one
    (``(d0, .., dk, K) -> (d0 * .. * dk, K)``) and only the next layer reads it, else None."""
    if reshape is None or reshape.kind != "Reshape" or reshape.name not in members:
        return None
    before, after = reshape.input_infos[0], reshape.outputs[0].info
    if before is None or after is None or not before.is_static or not after.is_static:
        return None
    shape, rows = static_dims(before.shape), static_dims(after.shape)
    if len(shape) < 3 or len(rows) != 2 or rows != (int(np.prod(shape[:-1])), shape[-1]):
        return None
    return shape if len(reshape.outputs[0].connections) == 1 else None


def gemm_on_rows(
    layer: Layer, members: set[str], activations: Collection[str] | None = None
) -> Fusion | None:
    """Reshape of a sequence to rows -> Gemm by a matrix (+ a bias vector) -> Reshape back to
    the sequence's leading dims -> one MatMulBias of the sequence (GPT-2's Conv1D layers,
    exported from ``addmm`` on a view), with the residual Add and the activation after it
    (``_with_residual``), or the activation alone, fused too. A backend offers it by passing
    this among its ``patterns``."""
    if layer.kind != "Gemm" or layer.activation is not None or len(layer.inputs) < 2:
        return None
    desc = layer.descriptor
    if desc.transA or desc.transB or desc.alpha != 1 or desc.broadcast:
        return None
    inner = layer.inputs[0].source.layer if layer.inputs[0].source is not None else None
    shape = _rows_view(inner, members)
    w, c = layer.input_infos[1], layer.input_infos[2] if len(layer.inputs) > 2 else None
    if shape is None or w is None or w.shape is None or len(w.shape) != 2:
        return None
    bias = layer.inputs[2].source if c is not None else None
    if c is not None and (desc.beta != 1 or c.shape != (w.shape[1],)):
        return None  # MatMulBias takes a vector along the columns
    outer = _only_reader(layer, members)
    out = outer.outputs[0].info if outer is not None and outer.kind == "Reshape" else None
    if out is None or not out.is_static or static_dims(out.shape) != (*shape[:-1], w.shape[1]):
        return None
    assert inner is not None and outer is not None  # checked by _rows_view and above
    fused: list[Layer] = [inner, layer, outer]
    z = None
    activation = _activation_of(_only_reader(outer, members), activations)
    found = _with_residual(outer, members, activations)
    if found is not None:
        more, z, activation = found
        fused += more[1:]
    elif activation is not None:
        fused.append(_only_reader(outer, members))  # type: ignore[arg-type]  # the activation found
    sources = (inner.inputs[0].source, layer.inputs[1].source, bias, z)
    return fused, ReplacementLayer("MatMulBias", NoDescriptor(), sources, activation, layer.name)


def fused_activation(
    layer: Layer, members: set[str], kinds: frozenset[str], activations: Collection[str] | None = None
) -> Fusion | None:
    """A layer of ``kinds`` + the activation of ``activations`` that is its only reader -> the
    layer, fused."""
    if layer.kind not in kinds or layer.activation is not None:
        return None
    after = _only_reader(layer, members)
    activation = _activation_of(after, activations)
    if after is None or activation is None:
        return None
    sources = tuple(s.source for s in layer.inputs)
    return [layer, after], ReplacementLayer(layer.kind, layer.descriptor, sources, activation, layer.name)


def _supported(support: LayerSupport, fusion: Fusion) -> bool:
    _, rep = fusion
    inputs = [s.info if s is not None else None for s in rep.inputs]
    outputs = [fusion[0][-1].outputs[0].info]
    return support.is_layer_supported(rep.kind, rep.descriptor, inputs, outputs).supported


def offer_fusions(
    view: Iterable[Layer],
    support: LayerSupport,
    activation_kinds: frozenset[str] = frozenset(),
    patterns: Sequence[Callable[[Layer, set[str]], Fusion | None]] = (),
    activations: Collection[str] | None = None,
) -> OptimizationViews:
    """The substitutions ``support``'s backend can run in ``view``; the rest untouched.

    ``activations`` are the activation kinds the backend applies fused to the layers of
    ``activation_kinds``: by default those every such backend applies
    (``activation_kinds("everywhere")`` of the activation table), or more (CpuAcc adds its
    curves).

    ``patterns`` are more finders, ``(layer, names of the view's layers) -> Fusion | None``,
    tried first (``pattern_fusions.PATTERN_FUSIONS``: activations and norms written out)."""
    layers = list(view)
    with_activation = getattr(getattr(view, "options", None), "fuse_activations", True)
    if not with_activation:
        activation_kinds = frozenset()
    if activations is None:
        activations = layer_kind.activation_kinds("everywhere")
    members = {layer.name for layer in layers}
    taken: set[str] = set()
    views = OptimizationViews()
    for find in (
        *(lambda layer, pattern=pattern: pattern(layer, members) for pattern in patterns),
        lambda layer: matmul_add(layer, members, activation_kinds, activations),
        lambda layer: fused_activation(layer, members, activation_kinds, activations),
    ):
        for layer in layers:
            fusion = None if layer.name in taken else find(layer)
            if fusion is None or any(f.name in taken for f in fusion[0]) or not _supported(support, fusion):
                continue
            taken.update(f.name for f in fusion[0])
            views.add_substitution(fusion[0], fusion[1])
    rest = [layer for layer in layers if layer.name not in taken]
    if rest:
        views.add_untouched(rest)
    return views
