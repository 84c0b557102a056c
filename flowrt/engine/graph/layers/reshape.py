"""Reshape, Flatten, Squeeze and Unsqueeze: layers that change a tensor's shape, not its data."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import attrs
import numpy as np

from flowrt.engine.graph.layer_kind import as_tuple, layer_kind
from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import ShapeError
from flowrt.types import Dim, TensorInfo


def const_ints(value: np.ndarray | None) -> list[int] | None:
    """The values of a constant integer tensor as a flat list of ints, or None when not constant."""
    if value is None:
        return None
    return [int(v) for v in np.asarray(value).reshape(-1)]


def dim_product(dims: Sequence[Dim]) -> Dim:
    """The product of dims: an int when all are known, the one non-1 unknown dim, else None."""
    unknown = [d for d in dims if not isinstance(d, int)]
    known = math.prod(d for d in dims if isinstance(d, int))  # Python ints: no overflow
    if not unknown:
        return known
    if known == 0:
        return 0
    if len(unknown) == 1 and known == 1:
        return unknown[0]
    return None


@attrs.frozen
class ReshapeDescriptor:
    """Reshape: the target shape comes from the second input (from the ``shape`` attribute
    before opset 5). A 0 copies the input's dim unless ``allowzero``; one -1 is inferred."""

    shape: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)
    consumed_inputs: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)
    allowzero: int = attrs.field(default=0, validator=attrs.validators.in_((0, 1)))


def _missing_dim(in_shape: Sequence[Dim], out_dims: list[Dim], where: str) -> Dim:
    """The dim that a -1 stands for, cancelling symbolic dims present on both sides."""
    rest_in = list(in_shape)
    rest_out = []
    for d in out_dims:
        if isinstance(d, str) and d in rest_in:
            rest_in.remove(d)
        else:
            rest_out.append(d)
    total, known = dim_product(rest_in), dim_product(rest_out)
    if not isinstance(total, int) or not isinstance(known, int):
        return None
    if known == 0 or total % known:
        raise ShapeError(
            f"{where}: cannot infer the -1 dim: {total} elements do not divide by the {known} of the other target dims"
        )
    return total // known


def reshape_dims(in_shape: Sequence[Dim] | None, target: Sequence[int], allowzero: bool) -> tuple[Dim, ...]:
    """Output shape of Reshape for a known target; dims it cannot know are None."""
    where = "Reshape"
    if sum(1 for t in target if t == -1) > 1:
        raise ShapeError(f"{where}: at most one -1 expected in the target shape, got {list(target)}")
    if any(t < -1 for t in target):
        raise ShapeError(f"{where}: target dims must be >= -1, got {list(target)}")
    if allowzero and 0 in target and -1 in target:
        raise ShapeError(
            f"{where}: a target shape with allowzero may not hold both 0 and -1, got {list(target)}"
        )
    out: list[Dim] = []
    for i, t in enumerate(target):
        if t == 0 and not allowzero:
            if in_shape is None:
                out.append(None)
                continue
            if i >= len(in_shape):
                raise ShapeError(
                    f"{where}: target dim {i} is 0 (copy) but the input has rank {len(in_shape)}"
                )
            out.append(in_shape[i])
        else:
            out.append(t)
    if -1 in target:
        i = list(target).index(-1)
        known = [d for j, d in enumerate(out) if j != i]
        out[i] = None if in_shape is None else _missing_dim(in_shape, known, where)
    elif in_shape is not None:
        total, new = dim_product(list(in_shape)), dim_product(out)
        if isinstance(total, int) and isinstance(new, int) and total != new:
            raise ShapeError(
                f"{where}: cannot reshape {total} elements into shape {tuple(out)} of {new} elements"
            )
    return tuple(out)


@layer_kind("Reshape", ReshapeDescriptor, min_inputs=1, max_inputs=2)
def infer_reshape(desc: ReshapeDescriptor, inputs, consts):
    data = inputs[0]
    target = const_ints(consts[1]) if len(consts) > 1 else None
    if target is None and desc.shape is not None and (len(inputs) < 2 or inputs[1] is None):
        target = list(desc.shape)
    if target is not None:
        return [TensorInfo(reshape_dims(data.shape, target, bool(desc.allowzero)), data.dtype)]
    shape_info = inputs[1] if len(inputs) > 1 else None
    if shape_info is None:
        raise ShapeError(
            "Reshape: a target shape is expected (second input or 'shape' attribute), found none"
        )
    length = shape_info.shape[0] if shape_info.shape is not None and len(shape_info.shape) == 1 else None
    return [TensorInfo(None if not isinstance(length, int) else (None,) * length, data.dtype)]


@attrs.frozen
class FlattenDescriptor:
    """Flatten: dims before ``axis`` become the rows, the rest the columns (negative counts from the end)."""

    axis: int = 1


@layer_kind("Flatten", FlattenDescriptor)
def infer_flatten(desc: FlattenDescriptor, inputs, consts):
    data = inputs[0]
    if data.shape is None:
        return [TensorInfo((None, None), data.dtype)]
    rank = len(data.shape)
    if not -rank <= desc.axis <= rank:
        raise ShapeError(f"Flatten: axis in [{-rank}, {rank}] expected for rank {rank}, got {desc.axis}")
    axis = desc.axis % rank if desc.axis < 0 else desc.axis
    return [TensorInfo((dim_product(data.shape[:axis]), dim_product(data.shape[axis:])), data.dtype)]


@attrs.frozen
class SqueezeDescriptor:
    """Squeeze / Unsqueeze: ``axes`` is an attribute before opset 13, the second input after."""

    axes: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)


def chosen_axes(desc: SqueezeDescriptor, value: np.ndarray | None) -> list[int] | None:
    """The axes from the attribute, else from the second input's value; None when neither
    gives any (an empty list counts as none, as onnx's reference reads it)."""
    axes = list(desc.axes) if desc.axes else const_ints(value)
    return axes or None


def _axes(desc: SqueezeDescriptor, inputs, consts) -> tuple[list[int] | None, bool]:
    """The axes (None if not known before the run) and whether any were given at all."""
    from_input = len(inputs) > 1 and inputs[1] is not None
    axes = chosen_axes(desc, consts[1] if from_input else None)
    if desc.axes or axes is not None:
        return axes, True
    known_empty = from_input and consts[1] is not None
    return None, from_input and not known_empty


def squeeze_axes(shape: Sequence[Dim], axes: Sequence[int] | None) -> list[int]:
    """The normalized axes Squeeze removes; ShapeError when a chosen known dim is not 1."""
    rank = len(shape)
    if axes is None:
        return [i for i, d in enumerate(shape) if d == 1]
    norm = sorted({normalize_axis(a, rank, "Squeeze") for a in axes})
    for a in norm:
        if isinstance(shape[a], int) and shape[a] != 1:
            raise ShapeError(
                f"Squeeze: dim {a} of shape {tuple(shape)} must be 1 to be squeezed, got {shape[a]}"
            )
    return norm


@layer_kind("Squeeze", SqueezeDescriptor, min_inputs=1, max_inputs=2)
def infer_squeeze(desc: SqueezeDescriptor, inputs, consts):
    data = inputs[0]
    axes, given = _axes(desc, inputs, consts)
    if data.shape is None or (given and axes is None):
        return [TensorInfo(None, data.dtype)]
    if not given and not all(isinstance(d, int) for d in data.shape):
        # Which dims are 1 is not known before the run.
        return [TensorInfo(None, data.dtype)]
    drop = set(squeeze_axes(data.shape, axes))
    return [TensorInfo(tuple(d for i, d in enumerate(data.shape) if i not in drop), data.dtype)]


def unsqueeze_shape(shape: Sequence[Dim], axes: Sequence[int]) -> tuple[Dim, ...]:
    """The shape after inserting a 1 at each of ``axes`` (indices into the output)."""
    rank = len(shape) + len(axes)
    norm = [normalize_axis(a, rank, "Unsqueeze") for a in axes]
    if len(set(norm)) != len(norm):
        raise ShapeError(f"Unsqueeze: axes must be unique, got {list(axes)}")
    rest = iter(shape)
    return tuple(1 if i in norm else next(rest) for i in range(rank))


@layer_kind("Unsqueeze", SqueezeDescriptor, min_inputs=1, max_inputs=2)
def infer_unsqueeze(desc: SqueezeDescriptor, inputs, consts):
    data = inputs[0]
    axes, given = _axes(desc, inputs, consts)
    if not given:
        raise ShapeError("Unsqueeze: axes are expected (attribute before opset 13, input after), found none")
    if axes is not None:
        return [TensorInfo(None if data.shape is None else unsqueeze_shape(data.shape, axes), data.dtype)]
    axes_shape = inputs[1].shape
    count = axes_shape[0] if axes_shape is not None and len(axes_shape) == 1 else None
    if data.shape is None or not isinstance(count, int):
        return [TensorInfo(None, data.dtype)]
    return [TensorInfo((None,) * (len(data.shape) + count), data.dtype)]


# The shape a view kind gives its data input at run time, from the input's shape and the
# values of its other inputs: what every backend's view kernel computes, written once.


def reshaped_shape(desc: ReshapeDescriptor, shape: tuple[int, ...], target=None) -> tuple[Dim, ...]:
    """Reshape's output shape (ints, for a run's shape): ``target`` (the second input's value)
    or the ``shape`` attribute."""
    dims = const_ints(target) if target is not None else desc.shape
    if dims is None:
        raise ShapeError(
            "Reshape: a target shape is expected (second input or 'shape' attribute), found none"
        )
    return reshape_dims(shape, dims, bool(desc.allowzero))


def flattened_shape(desc: FlattenDescriptor, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Flatten's output shape: (product of the dims before ``axis``, product of the rest)."""
    axis = desc.axis % len(shape) if desc.axis < 0 else desc.axis
    return (math.prod(shape[:axis]), math.prod(shape[axis:]))


def squeezed_shape(desc: SqueezeDescriptor, shape: tuple[int, ...], axes=None) -> tuple[int, ...]:
    """Squeeze's output shape: ``shape`` without the chosen dims (every 1 when none are chosen)."""
    drop = squeeze_axes(shape, chosen_axes(desc, axes))
    return tuple(d for i, d in enumerate(shape) if i not in drop)


def unsqueezed_shape(desc: SqueezeDescriptor, shape: tuple[int, ...], axes=None) -> tuple[Dim, ...]:
    """Unsqueeze's output shape (ints, for a run's shape): ``shape`` with a 1 inserted at each
    chosen axis."""
    return unsqueeze_shape(shape, chosen_axes(desc, axes) or [])


VIEW_SHAPES: dict[str, Callable[..., tuple[Dim, ...]]] = {
    "Reshape": reshaped_shape,
    "Flatten": flattened_shape,
    "Squeeze": squeezed_shape,
    "Unsqueeze": unsqueezed_shape,
}
