"""Batching rules: for each layer kind, where the batch axis of its inputs leaves its outputs.

The re-batching pass (``flowrt.engine.graph.passes.batch``) walks a graph whose shapes are
inferred at batch 1 and follows the axis that carries the samples from the inputs to the
outputs. A rule gets the layer and, per input, the batch axis of that input (None: the input
does not depend on the network's inputs, e.g. weights). It returns the batch axis of the
layer's outputs (a tuple, one per output, where they differ: a recurrent layer's), or a
:class:`Rewrite` when the layer must change to run N samples (a Reshape whose target
hard-codes the batch of 1). A rule raises :class:`Refused` when it cannot prove
that every sample stays separate: a batch that another sample's values could flow into is
never re-batched. A kind without a rule is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import numpy as np

from flowrt.engine.graph.graph import Graph, Layer, constant_value
from flowrt.engine.graph.layers.reduce import REDUCE_DTYPES, reduce_axes
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import ShapeError
from flowrt.types import Dim


@attrs.frozen
class Interleaved:
    """The batch folded into ``axis`` inside each of its blocks: at batch 1 the axis holds
    ``size // inner`` blocks of ``inner`` elements, at batch N each block holds the N
    samples' ``inner`` elements in turn (a multi-head attention's heads put back as rows of
    (sequence x samples): its output projection sees rows ``s * N + n``). Only the rules
    that say so take it (:data:`TAKES_INTERLEAVED`): a row-wise product keeps it, a Reshape
    that gives each sample an axis of its own unfolds it."""

    axis: int
    inner: int


Axis = int | None
Axes = tuple[Axis, ...]  # one batch axis per output of a layer
# What a tensor may carry: the rules of TAKES_INTERLEAVED also see (and give) Interleaved.
Carried = int | Interleaved | None


class Refused(Exception):
    """Why a layer cannot be shown to keep samples apart (the pass names the layer)."""


@attrs.frozen
class Rewrite:
    """A layer that keeps samples apart once ``apply(graph, batch)`` has changed it; ``apply``
    returns one line for the optimizer's report."""

    axis: Carried | Axes
    apply: Callable[[Graph, int], str]


Rule = Callable[[Layer, list[Axis]], "Carried | Axes | Rewrite"]
RULES: dict[str, Rule] = {}


def batch_rule(*kinds: str) -> Callable[[Rule], Rule]:
    """Register the decorated rule for ``kinds``."""

    def register(rule: Rule) -> Rule:
        for kind in kinds:
            RULES[kind] = rule
        return rule

    return register


# -- helpers ------------------------------------------------------------------------------
def input_shape(layer: Layer, index: int) -> tuple[Dim, ...]:
    info = layer.input_infos[index]
    if info is None or info.shape is None:
        raise Refused(f"the shape of input {index} is not known")
    return tuple(info.shape)


def only_batched(axes: list[Axis], *batched: int) -> None:
    """Inputs other than ``batched`` must not carry the batch (weights, biases, parameters)."""
    for i, axis in enumerate(axes):
        if i not in batched and axis is not None:
            raise Refused(f"input {i} carries the batch (axis {axis}); only input(s) {list(batched)} may")


def batched_first(axes: list[Axis], at: int | None = None) -> int:
    """The batch axis of input 0, which must carry the batch (on axis ``at`` when given)."""
    axis = axes[0]
    if axis is None:
        raise Refused("input 0 does not carry the batch but another input does")
    if isinstance(axis, Interleaved):
        raise Refused(f"input 0 carries the batch interleaved with other rows on axis {axis.axis}")
    if at is not None and axis != at:
        raise Refused(f"the batch must be on axis {at} of input 0, found it on axis {axis}")
    only_batched(axes, 0)
    return axis


def same_fold(
    layer: Layer, batched: list[tuple[int, int]], shapes: Sequence[tuple[Dim, ...]] | None = None
) -> None:
    """Inputs that carry the batch hold it with the same size per sample (1, or the rows a
    Reshape folded into it: ``batch_rules_reshape``); a size of 1 would broadcast one
    sample's row over another sample's rows. ``shapes``: the inputs' shapes as the layer
    reads them, where not as given."""
    sizes = {(shapes[i] if shapes else input_shape(layer, i))[axis] for i, axis in batched}
    if len(sizes) > 1:
        raise Refused(
            f"its inputs hold {sorted(sizes, key=str)} rows of each sample on the batch axis; one size is expected"
        )


def not_along(axis: int, along: int, what: str) -> None:
    if axis == along:
        raise Refused(f"it works {what} axis {along}, which carries the batch")


# -- per-sample layers --------------------------------------------------------------------
PER_ELEMENT = (
    "Relu Sigmoid Tanh Softplus Softsign HardSwish Mish LeakyRelu Elu Celu ThresholdedRelu "
    "HardSigmoid Selu Gelu Swish Shrink Exp Log Sqrt Reciprocal Floor Ceil Round Sin Cos Tan Asin "
    "Acos Atan Sinh Cosh Asinh Acosh Atanh Abs Neg Sign Erf Not IsNaN IsInf Identity Cast Dropout "
    "Clip BitwiseNot"
).split()

# Layers over N x C x spatial data: each sample is computed on its own when the batch is axis 0.
PER_SAMPLE_NCHW = (
    "Conv ConvTranspose MaxPool AveragePool LpPool GlobalAveragePool GlobalMaxPool GlobalLpPool "
    "LRN BatchNormalization InstanceNormalization GroupNormalization DepthToSpace SpaceToDepth"
).split()


@batch_rule(*PER_ELEMENT)
def per_element(layer: Layer, axes: list[Axis]) -> Carried:
    if isinstance(axes[0], Interleaved):  # element by element: any layout of the samples
        only_batched(axes, 0)
        return axes[0]
    return batched_first(axes)


@batch_rule(*PER_SAMPLE_NCHW)
def per_sample_nchw(layer: Layer, axes: list[Axis]) -> Axis:
    return batched_first(axes, at=0)


@batch_rule("FusedConv")
def fused_conv(layer: Layer, axes: list[Axis]) -> Axis:
    """A Conv and the residual Z added to it (X, W, B, Z): X and Z carry the batch on axis 0,
    each sample's Z added to its own output; a Z the same for every sample would not have
    the re-batched output's shape."""
    given = (axes + [None] * 4)[:4]
    if given[0] != 0 or given[3] != 0:
        found = ", ".join(
            f"input {i} on {'no axis' if given[i] is None else f'axis {given[i]}'}" for i in (0, 3)
        )
        raise Refused(f"X and Z must carry the batch on axis 0, found {found}")
    only_batched(axes, 0, 3)
    same_fold(layer, [(0, 0), (3, 0)])
    return 0


BROADCASTING = (
    "Add Sub Mul Div Pow Mod BitShift And Or Xor Equal Less Greater LessOrEqual GreaterOrEqual "
    "BitwiseAnd BitwiseOr BitwiseXor Max Min Sum Mean Where PRelu"
).split()


@batch_rule(*BROADCASTING)
def broadcasting(layer: Layer, axes: list[Axis]) -> Axis:
    """Numpy broadcasting: batched inputs agree on the (right-aligned) batch axis, and the other
    inputs have 1 there (or no dim at all), so they broadcast over the samples."""
    return broadcast_axis(layer, axes)


def broadcast_axis(layer: Layer, axes: list[Axis], read: Sequence[tuple[Dim, ...]] | None = None) -> int:
    """The batch axis of ``layer``'s output under numpy broadcasting (``broadcasting``);
    ``read``: the inputs' shapes as the layer reads them, where not as given."""
    if getattr(layer.descriptor, "legacy", False) and getattr(layer.descriptor, "broadcast", 0):
        raise Refused("pre-opset-7 broadcasting along an axis is not re-batched")
    present = [i for i, slot in enumerate(layer.inputs) if slot.source is not None]
    shapes = {i: read[i] if read else input_shape(layer, i) for i in present}
    rank = max(len(s) for s in shapes.values())
    aligned = {given + rank - len(shapes[i]) for i in present if (given := axes[i]) is not None}
    if len(aligned) != 1:
        raise Refused(f"its inputs carry the batch on different axes ({sorted(aligned)}, right-aligned)")
    axis = aligned.pop()
    same_fold(layer, [(i, given) for i in present if (given := axes[i]) is not None], read)
    for i in present:
        k = axis - (rank - len(shapes[i]))
        if axes[i] is None and k >= 0 and shapes[i][k] != 1:
            raise Refused(
                f"input {i} does not carry the batch but has {shapes[i][k]} on the batch axis {axis}; "
                "1 is expected, so that it broadcasts over the samples"
            )
    return axis


# -- layers that work along one axis ------------------------------------------------------
@batch_rule("Softmax", "LogSoftmax", "Hardmax")
def softmax(layer: Layer, axes: list[Axis]) -> Axis:
    batch = batched_first(axes)
    along = layer.descriptor.resolved_axis(len(input_shape(layer, 0)), layer.kind)
    if layer.descriptor.coerces_to_2d and batch >= along:
        raise Refused(f"before opset 13 it normalizes over axes {along} and on, which hold the batch")
    not_along(batch, along, "along")
    return batch


@batch_rule("AttentionSoftmax", "ApplyRotary")
def along_last_axis_broadcasting(layer: Layer, axes: list[Axis]) -> Axis:
    """X carries the batch, not on the last axis (the one normalized or rotated); the other
    inputs (the mask; cos and sin) carry it on the same axis, right-aligned, or broadcast over
    the samples (numpy's rule, as an Add's)."""
    if axes[0] is None:
        raise Refused("its input X must carry the batch; another input alone carrying it would grow X")
    perm = getattr(layer.descriptor, "perm", None)  # ApplyRotary's: X read transposed
    if perm is None:
        axis = broadcast_axis(layer, axes)
    else:
        if isinstance(axes[0], Interleaved):
            raise Refused(f"input 0 carries the batch interleaved with other rows on axis {axes[0].axis}")
        x = input_shape(layer, 0)
        read = [tuple(x[p] for p in perm), *(input_shape(layer, i) for i in range(1, len(layer.inputs)))]
        axis = broadcast_axis(layer, [list(perm).index(axes[0]), *axes[1:]], read)
    not_along(axis, len(input_shape(layer, 0)) - 1, "along")
    return axis


@batch_rule("LpNormalization", "CumSum", "CumProd")
def along_axis(layer: Layer, axes: list[Axis]) -> Axis:
    batch = batched_first(axes)
    if layer.kind == "LpNormalization":
        along = layer.descriptor.axis
    else:
        values = const_ints(constant_value(layer.inputs[1].source))
        if not values:
            raise Refused("its axis is computed at run time")
        along = values[0]
    not_along(batch, normalize_axis(along, len(input_shape(layer, 0)), layer.kind), "along")
    return batch


@batch_rule("LayerNormalization", "RMSNormalization")
def layer_norm(layer: Layer, axes: list[Axis]) -> Axis:
    batch = batched_first(axes)
    if batch >= normalize_axis(layer.descriptor.axis, len(input_shape(layer, 0)), layer.kind):
        raise Refused(f"it normalizes over axes {layer.descriptor.axis} and on, which hold the batch")
    return batch


@batch_rule("Split")
def split(layer: Layer, axes: list[Axis]) -> Axis:
    batch = batched_first(axes)
    not_along(batch, normalize_axis(layer.descriptor.axis, len(input_shape(layer, 0))), "along")
    return batch


def _reduced(layer: Layer, batch: int, reduced: Sequence[int], keepdims: int) -> int:
    if batch in reduced:
        raise Refused(f"it reduces axes {list(reduced)}, which include the batch axis {batch}")
    return batch if keepdims else batch - sum(1 for a in reduced if a < batch)


@batch_rule(*REDUCE_DTYPES)
def reduce(layer: Layer, axes: list[Axis]) -> Axis:
    batch = batched_first(axes)
    given = len(layer.inputs) > 1 and layer.inputs[1].source is not None
    values = const_ints(constant_value(layer.inputs[1].source)) if given else None
    if given and values is None:
        raise Refused("its axes are computed at run time")
    reduced = reduce_axes(layer.descriptor, len(input_shape(layer, 0)), values, layer.kind)
    return _reduced(layer, batch, reduced, layer.descriptor.keepdims)


@batch_rule("ArgMax", "ArgMin")
def arg_reduce(layer: Layer, axes: list[Axis]) -> Axis:
    batch = batched_first(axes)
    along = normalize_axis(layer.descriptor.axis, len(input_shape(layer, 0)), layer.kind)
    return _reduced(layer, batch, (along,), layer.descriptor.keepdims)


# -- matrix products ----------------------------------------------------------------------
@batch_rule("Gemm")
def gemm(layer: Layer, axes: list[Axis]) -> Carried:
    """The batch on A's rows, folded there or not: each output row is its A row's."""
    rows = 1 if layer.descriptor.transA else 0
    given = axes[0]
    if isinstance(given, Interleaved) and given.axis == rows:
        only_batched(axes, 0)
    else:
        batched_first(axes, at=rows)
    if len(layer.inputs) > 2 and layer.inputs[2].source is not None:
        c = input_shape(layer, 2)
        if len(c) == 2 and c[0] != 1:
            raise Refused(f"its C input {c} has {c[0]} rows; 1 is expected, so that it broadcasts")
    return Interleaved(0, given.inner) if isinstance(given, Interleaved) else 0


@batch_rule("MatMul")
def matmul(layer: Layer, axes: list[Axis]) -> Axis:
    """The batch on a row axis of A or on a broadcast (leading) axis of A, of B or of both
    (attention's Q K^T), never on the axis contracted."""
    return _matmul(layer, axes)


def _matmul(layer: Layer, axes: list[Axis], shapes: Sequence[tuple[Dim, ...]] | None = None) -> Axis:
    """MatMul's rule (MatMulBias's for its A and B; TransposedMatMul's on ``shapes``, its
    operands as read)."""
    only_batched(axes, 0, 1)
    a, b = shapes or (input_shape(layer, 0), input_shape(layer, 1))
    if axes[1] is None:
        batch = batched_first(axes)
        if len(a) < 2 or batch == len(a) - 1:
            raise Refused("the batch is on the axis it contracts")
        if len(b) == 1:
            return batch
    elif len(b) < 3 or axes[1] >= len(b) - 2:
        raise Refused(f"input 1 carries the batch on axis {axes[1]}, one of its matrix axes")
    rank = max(len(a), len(b))
    aligned = {k + rank - len(s) for k, s in ((axes[0], a), (axes[1], b)) if k is not None}
    if len(aligned) != 1:
        raise Refused(f"its inputs carry the batch on axes {axes[:2]}, not on one broadcast axis")
    axis = aligned.pop()
    same_fold(layer, [(i, given) for i in (0, 1) if (given := axes[i]) is not None], [a, b])
    for i, shape in enumerate((a, b)):
        at = axis - (rank - len(shape))
        if axes[i] is None and len(shape) > 1 and 0 <= at < len(shape) - 2 and shape[at] != 1:
            raise Refused(
                f"input {i} has {shape[at]} on the batch axis {axis}; 1 is expected, so that it broadcasts"
            )
    return axis


@batch_rule("MatMulBias")
def matmul_bias(layer: Layer, axes: list[Axis]) -> Axis:
    """MatMul's rule for A and B (the bias never carries the batch); a residual Z (input 3)
    carries it where the output does, each sample's Z added to its own rows: a Z the same for
    every sample would not have the re-batched output's shape."""
    given = (axes + [None] * 4)[:4]
    only_batched(given, 0, 1, 3)
    axis = _matmul(layer, [*given[:2], None, None])
    if len(layer.inputs) > 3 and layer.inputs[3].source is not None:
        if given[3] != axis:
            found = "no axis" if given[3] is None else f"axis {given[3]}"
            raise Refused(f"its residual Z must carry the batch on the output's axis {axis}, found {found}")
        same_fold(layer, [(i, a) for i, a in enumerate(given) if isinstance(a, int)])
    return axis


@batch_rule("TransposedMatMul")
def transposed_matmul(layer: Layer, axes: list[Axis]) -> Axis:
    """MatMul's rule on the operands as read: each one's batch axis where its permutation
    moves it; the result's where ``perm_y`` moves it."""
    only_batched(axes, 0, 1)
    moved: list[Axis] = []
    shapes = []
    for i, perm in enumerate((layer.descriptor.perm_a, layer.descriptor.perm_b)):
        shape, given = input_shape(layer, i), axes[i]
        if isinstance(given, Interleaved):
            raise Refused(f"input {i} carries the batch interleaved with other rows on axis {given.axis}")
        moved.append(given if perm is None or given is None else list(perm).index(given))
        shapes.append(shape if perm is None else tuple(shape[p] for p in perm))
    axis = _matmul(layer, moved, shapes)
    perm_y = layer.descriptor.perm_y
    return axis if perm_y is None or axis is None else list(perm_y).index(axis)


# -- layout -------------------------------------------------------------------------------
@batch_rule("Transpose")
def transpose(layer: Layer, axes: list[Axis]) -> Axis:
    batch = batched_first(axes)
    perm = layer.descriptor.perm or tuple(reversed(range(len(input_shape(layer, 0)))))
    return list(perm).index(batch)


@batch_rule("Flatten")
def flatten(layer: Layer, axes: list[Axis]) -> Axis:
    """Rows of (dims before ``axis``) x (the rest): the batch stays on axis 0, each sample's
    rows one after the other where dims other than 1 join it (folded, as a Reshape folds
    them: ``batch_rules_reshape``; an output must not stay so)."""
    batched_first(axes, at=0)
    shape = input_shape(layer, 0)
    axis = layer.descriptor.axis
    if axis == 0 or axis == -len(shape):
        raise Refused("with axis 0 it folds the batch into the columns")
    return 0


def _squeeze_axes(layer: Layer) -> list[int] | None:
    if layer.descriptor.axes:
        return list(layer.descriptor.axes)
    if len(layer.inputs) > 1 and layer.inputs[1].source is not None:
        values = const_ints(constant_value(layer.inputs[1].source))
        if values is None:
            raise Refused("its axes are computed at run time")
        return values or None
    return None


@batch_rule("Squeeze")
def squeeze(layer: Layer, axes: list[Axis]) -> Axis:
    batch = batched_first(axes)
    rank = len(input_shape(layer, 0))
    chosen = _squeeze_axes(layer)
    if chosen is None:
        raise Refused("without axes it squeezes every dim of 1, the batch of 1 included")
    removed = {normalize_axis(a, rank) for a in chosen}
    if batch in removed:
        raise Refused(f"it squeezes the batch axis {batch}")
    return batch - sum(1 for a in removed if a < batch)


@batch_rule("Unsqueeze")
def unsqueeze(layer: Layer, axes: list[Axis]) -> Axis:
    batch = batched_first(axes)
    chosen = _squeeze_axes(layer)
    if chosen is None:
        raise Refused("its axes are not known before the run")
    rank = len(input_shape(layer, 0)) + len(chosen)
    inserted = {normalize_axis(a, rank) for a in chosen}
    kept = [i for i in range(rank) if i not in inserted]
    return kept[batch]


def replace_constant_input(graph: Graph, layer: Layer, index: int, value: np.ndarray, name: str) -> None:
    """Feed input ``index`` of ``layer`` from a new Constant holding ``value`` (of the old
    constant's dtype); the old constant is left to others that read it."""
    slot = layer.inputs[index]
    old, current = slot.source, constant_value(slot.source)
    assert old is not None and current is not None  # the input is a constant
    value = np.asarray(value, dtype=current.dtype)
    const = graph.add_layer("Constant", type(old.layer.descriptor)(value), name=f"{layer.name}/{name}")
    old.disconnect(slot)
    const.outputs[0].connect(slot)


# -- layers whose output is the batch itself -----------------------------------------------
@batch_rule("Shape", "Size")
def shape_of_batch(layer: Layer, axes: list[Axis]) -> Axis:
    raise Refused("its value is the batch-1 shape; fold constants first so it becomes a constant")


# The kinds whose rules take an input whose batch is interleaved (any other refuses it).
TAKES_INTERLEAVED = frozenset(("Gemm", "Reshape", *PER_ELEMENT))


def check_output(name: str, axis: Carried, shape: tuple[Dim, ...] | None) -> None:
    """Outputs carry the batch on axis 0, one row per sample (not folded with other rows: see
    ``batch_rules_reshape``), where a batched run's results are split."""
    if isinstance(axis, Interleaved):
        raise ShapeError(
            f"cannot batch output {name!r}: it carries the batch interleaved with other rows on "
            f"axis {axis.axis}; axis 0 is expected"
        )
    if axis != 0:
        where = "does not depend on the inputs" if axis is None else f"carries the batch on axis {axis}"
        raise ShapeError(f"cannot batch output {name!r}: it {where}; axis 0 is expected")
    if shape is not None and shape[0] != 1:
        raise ShapeError(
            f"cannot batch output {name!r}: its axis 0 holds {shape[0]} rows of each sample; one is expected"
        )
