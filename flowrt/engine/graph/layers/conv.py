"""Conv and ConvTranspose, and the sliding-window arithmetic they share with the pooling kinds.

Every windowed kind (Conv, MaxPool, AveragePool, LpPool) resolves its output size and padding
with :func:`window_geometry`, so ``auto_pad``, ``ceil_mode``, strides and dilations mean the same
thing everywhere: in shape inference and in every backend's kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeGuard

import attrs

from flowrt.engine.graph.layer_kind import as_tuple, layer_kind
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import DataType, Dim, TensorInfo

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
FLOAT_TYPES = frozenset({DataType.FLOAT16, DataType.FLOAT32, DataType.FLOAT64, DataType.BFLOAT16})


def _all(check, what: str):
    """A validator: every entry of an optional tuple passes ``check``."""

    def validate(instance, attribute, value):
        if value is not None and not all(check(v) for v in value):
            raise ValueError(f"{attribute.name} must all be {what}, got {list(value)}")

    return validate


positive_ints = _all(lambda v: v >= 1, ">= 1")
non_negative_ints = _all(lambda v: v >= 0, ">= 0")


def auto_pad_field():
    """The ``auto_pad`` field of a windowed layer's descriptor."""
    # Some exporters write an empty auto_pad; ONNX Runtime reads it as NOTSET, and so do we.
    return attrs.field(
        default="NOTSET", converter=lambda v: v or "NOTSET", validator=attrs.validators.in_(AUTO_PADS)
    )


@attrs.frozen
class ConvDescriptor:
    """Conv: ``group`` splits channels into independent convolutions (``group == C``: depthwise);
    ``kernel_shape`` defaults to the weights' spatial dims; ``pads`` are all begins, then all ends."""

    auto_pad: str = auto_pad_field()
    dilations: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple, validator=positive_ints)
    group: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    kernel_shape: tuple[int, ...] | None = attrs.field(
        default=None, converter=as_tuple, validator=positive_ints
    )
    pads: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple, validator=non_negative_ints)
    strides: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple, validator=positive_ints)


@attrs.frozen
class ConvTransposeDescriptor:
    """ConvTranspose: the gradient of Conv. ``output_shape`` (spatial dims) fixes the output size
    and the pads are derived from it; ``output_padding`` adds cells at the end of each axis."""

    auto_pad: str = auto_pad_field()
    dilations: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple, validator=positive_ints)
    group: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    kernel_shape: tuple[int, ...] | None = attrs.field(
        default=None, converter=as_tuple, validator=positive_ints
    )
    output_padding: tuple[int, ...] | None = attrs.field(
        default=None, converter=as_tuple, validator=non_negative_ints
    )
    output_shape: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)
    pads: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)
    strides: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple, validator=positive_ints)


@attrs.frozen
class WindowGeometry:
    """A sliding window resolved along every spatial axis: output sizes (None where the input
    size is unknown) and the padding actually applied before and after each axis."""

    out: tuple[Dim, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]


def spatial_attribute(value: Sequence[int] | None, rank: int, default: int, name: str) -> tuple[int, ...]:
    """``value`` checked to hold one entry per spatial axis, or ``default`` on every axis."""
    if value is None:
        return (default,) * rank
    if len(value) != rank:
        raise ShapeError(f"{name} must have {rank} entries for {rank} spatial dims, got {list(value)}")
    return tuple(int(v) for v in value)


def _window_axis(
    size: Dim, kernel: int, stride: int, dilation: int, pads: tuple[int, int], auto_pad: str, ceil_mode: bool
) -> tuple[Dim, int, int]:
    span = (kernel - 1) * dilation + 1
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if not isinstance(size, int):
            return None, 0, 0
        out = -(-size // stride)
        total = max(0, (out - 1) * stride + span - size)
        # SAME_UPPER puts the odd cell of padding at the end, SAME_LOWER at the beginning.
        begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        return out, begin, total - begin
    begin, end = (0, 0) if auto_pad == "VALID" else pads
    if not isinstance(size, int):
        return None, begin, end
    room = size + begin + end - span
    if room < 0:
        raise ShapeError(
            f"window of {span} cells (kernel {kernel}, dilation {dilation}) does not fit in "
            f"spatial size {size} padded by ({begin}, {end})"
        )
    if not ceil_mode:
        return room // stride + 1, begin, end
    out = -(-room // stride) + 1
    # The last window must start inside the input or its leading padding, never in the trailing pad.
    if (out - 1) * stride >= size + begin:
        out -= 1
    return out, begin, end


def window_geometry(
    desc, spatial: Sequence[Dim], kernel: Sequence[int], ceil_mode: bool = False
) -> WindowGeometry:
    """Output sizes and pads of a windowed layer whose descriptor has ``auto_pad``, ``pads``,
    ``strides`` and ``dilations`` (absent ones default), for input spatial dims ``spatial``."""
    rank = len(spatial)
    strides = spatial_attribute(desc.strides, rank, 1, "strides")
    dilations = spatial_attribute(getattr(desc, "dilations", None), rank, 1, "dilations")
    pads = spatial_attribute(desc.pads, 2 * rank, 0, "pads")
    axes = [
        _window_axis(
            spatial[i],
            kernel[i],
            strides[i],
            dilations[i],
            (pads[i], pads[rank + i]),
            desc.auto_pad,
            ceil_mode,
        )
        for i in range(rank)
    ]
    return WindowGeometry(
        tuple(a[0] for a in axes), tuple(a[1] for a in axes), tuple(a[2] for a in axes), strides, dilations
    )


def expect_float(info: TensorInfo, what: str) -> None:
    """DataTypeError unless ``info`` holds floating-point numbers."""
    if info.dtype not in FLOAT_TYPES:
        raise DataTypeError(
            f"{what} expects a float16, float32 or float64 tensor, got {info.dtype.name.lower()}"
        )


def _known(d: Dim) -> TypeGuard[int]:
    return isinstance(d, int)


def _same_float_types(x: TensorInfo, w: TensorInfo, what: str) -> None:
    expect_float(x, what)
    if x.dtype != w.dtype:
        raise DataTypeError(
            f"{what} expects weights of the data's type {x.dtype.name.lower()}, got {w.dtype.name.lower()}"
        )


def _conv_operands(x: TensorInfo, w: TensorInfo, what: str) -> tuple[tuple[Dim, ...], tuple[Dim, ...]] | None:
    """Shapes of data and weights with a common rank (unknown ranks filled from the other);
    None where neither rank is known."""
    xs, ws = x.shape, w.shape
    rank = len(xs) if xs is not None else len(ws) if ws is not None else None
    if rank is None:
        return None
    if rank < 3:
        raise ShapeError(f"{what} expects data of rank >= 3 (N, C, spatial...), got rank {rank}")
    xs = xs if xs is not None else (None,) * rank
    ws = ws if ws is not None else (None,) * rank
    if len(xs) != len(ws):
        raise ShapeError(
            f"{what} expects weights of the data's rank {len(xs)}, got weights of shape {w.format_shape()}"
        )
    return xs, ws


def conv_kernel_shape(desc, w_shape: Sequence[Dim], what: str) -> tuple[Dim, ...]:
    """The kernel's spatial dims: the ``kernel_shape`` attribute, checked against the weights."""
    spatial = tuple(w_shape[2:])
    if desc.kernel_shape is None:
        return spatial
    kernel = spatial_attribute(desc.kernel_shape, len(spatial), 1, "kernel_shape")
    if any(_known(s) and s != k for s, k in zip(spatial, kernel, strict=True)):
        raise ShapeError(
            f"{what}: kernel_shape {list(kernel)} does not match weights of spatial shape {spatial}"
        )
    return kernel


def _check_bias(b: TensorInfo | None, channels: Dim, what: str) -> None:
    if b is None or b.shape is None:
        return
    if len(b.shape) != 1 or (_known(b.shape[0]) and _known(channels) and b.shape[0] != channels):
        raise ShapeError(f"{what} expects a bias of shape ({channels},), got {b.format_shape()}")


def _divisible(d: Dim, group: int, what: str) -> None:
    if _known(d) and d % group:
        raise ShapeError(f"{what} divisible by group {group}, got {d}")


@layer_kind("Conv", ConvDescriptor, min_inputs=2, max_inputs=3)
def infer_conv(desc: ConvDescriptor, inputs, consts):
    x, w, b = (list(inputs) + [None])[:3]
    _same_float_types(x, w, "Conv")
    return [TensorInfo(conv_output_shape(desc, x, w, b, "Conv"), x.dtype)]


@layer_kind("FusedConv", ConvDescriptor, min_inputs=2, max_inputs=4)
def infer_fused_conv(desc: ConvDescriptor, inputs, consts):
    """A Conv with a tensor of its output's shape added before its fused activation
    (``Y = act(Conv(X, W, B) + Z)``, ONNX Runtime's com.microsoft FusedConv with Z): what the
    optimizer makes of a Conv whose only reader is a residual Add, on a backend that offers
    it. Inputs X, W, B (optional: None), Z."""
    x, w, b, z = (list(inputs) + [None, None])[:4]
    _same_float_types(x, w, "FusedConv")
    shape = conv_output_shape(desc, x, w, b, "FusedConv")
    if (
        z is None
        or z.dtype != x.dtype
        or (shape is not None and z.shape is not None and tuple(z.shape) != shape)
    ):
        found = "no tensor" if z is None else f"{z.format_shape()} {z.dtype.value}"
        raise ShapeError(
            f"FusedConv expects Z of its output's shape {shape} and type {x.dtype.value}, got {found}"
        )
    return [TensorInfo(shape, x.dtype)]


def conv_output_shape(
    desc: ConvDescriptor, x: TensorInfo, w: TensorInfo, b: TensorInfo | None, what: str
) -> tuple[Dim, ...] | None:
    """The output shape of a convolution of data ``x`` by weights ``w`` (M, C / group,
    kernel...) with bias ``b`` (M,) (Conv, ConvInteger, QLinearConv), None where no rank is
    known; ShapeError naming ``what`` where they disagree."""
    operands = _conv_operands(x, w, what)
    if operands is None:
        return None
    xs, ws = operands
    n, c, m = xs[0], xs[1], ws[0]
    if _known(c) and _known(ws[1]) and c != ws[1] * desc.group:
        raise ShapeError(
            f"{what} expects {ws[1] * desc.group} input channels (weights {tuple(ws)} x group "
            f"{desc.group}), got data of shape {x.format_shape()}"
        )
    _divisible(m, desc.group, f"{what} expects output channels")
    _check_bias(b, m, what)
    kernel = conv_kernel_shape(desc, ws, what)
    known_kernel = [k for k in kernel if _known(k)]
    if len(known_kernel) < len(kernel):
        spatial = window_geometry(desc, (None,) * len(kernel), (1,) * len(kernel)).out
    else:
        spatial = window_geometry(desc, xs[2:], known_kernel).out
    return (n, m, *spatial)


@attrs.frozen
class TransposeGeometry:
    """ConvTranspose resolved: output sizes, and the pads cropped from the full scatter result
    (negative where the output extends past it)."""

    out: tuple[Dim, ...]
    pads_begin: tuple[Dim, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]


def conv_transpose_geometry(
    desc: ConvTransposeDescriptor, spatial: Sequence[Dim], kernel: Sequence[int]
) -> TransposeGeometry:
    """Output sizes and leading crop of a ConvTranspose, following the ONNX formulas:
    full = stride * (in - 1) + output_padding + (kernel - 1) * dilation + 1; out = full - pads,
    or ``output_shape`` / ``in * stride`` (SAME) with the pads derived from it."""
    rank = len(spatial)
    strides = spatial_attribute(desc.strides, rank, 1, "strides")
    dilations = spatial_attribute(desc.dilations, rank, 1, "dilations")
    extra = spatial_attribute(desc.output_padding, rank, 0, "output_padding")
    pads = spatial_attribute(desc.pads, 2 * rank, 0, "pads")
    target: Sequence[int | None] | None = None
    if desc.output_shape is not None:
        # Some exporters write N and C too; the spatial dims are the last ones.
        target = spatial_attribute(desc.output_shape[-rank:], rank, 0, "output_shape")
    elif desc.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = tuple(s * st if _known(s) else None for s, st in zip(spatial, strides, strict=True))
    out: list[Dim] = []
    begins: list[Dim] = []
    for i in range(rank):
        size = spatial[i]
        span = (kernel[i] - 1) * dilations[i] + 1
        full = strides[i] * (size - 1) + extra[i] + span if isinstance(size, int) else None
        if target is None:
            begin = 0 if desc.auto_pad == "VALID" else pads[i]
            end = 0 if desc.auto_pad == "VALID" else pads[rank + i]
            out.append(None if full is None else full - begin - end)
            begins.append(begin)
            continue
        wanted = target[i]
        out.append(wanted)
        if full is None or wanted is None:
            begins.append(None)
            continue
        total = full - wanted
        begins.append(total // 2 if desc.auto_pad == "SAME_UPPER" else total - total // 2)
    if any(_known(o) and o <= 0 for o in out):
        raise ShapeError(f"ConvTranspose output spatial shape {out} is not positive")
    return TransposeGeometry(tuple(out), tuple(begins), strides, dilations)


@layer_kind("ConvTranspose", ConvTransposeDescriptor, min_inputs=2, max_inputs=3)
def infer_conv_transpose(desc: ConvTransposeDescriptor, inputs, consts):
    x, w, b = (list(inputs) + [None])[:3]
    _same_float_types(x, w, "ConvTranspose")
    operands = _conv_operands(x, w, "ConvTranspose")
    if operands is None:
        return [TensorInfo(None, x.dtype)]
    xs, ws = operands
    c = xs[1]
    if _known(c) and _known(ws[0]) and c != ws[0]:
        raise ShapeError(
            f"ConvTranspose expects weights of shape ({c}, M/group, ...) for data of shape "
            f"{x.format_shape()}, got {w.format_shape()}"
        )
    _divisible(c, desc.group, "ConvTranspose expects input channels")
    m = ws[1] * desc.group if _known(ws[1]) else None
    _check_bias(b, m, "ConvTranspose")
    kernel = conv_kernel_shape(desc, ws, "ConvTranspose")
    known_kernel = [k for k in kernel if _known(k)]
    if len(known_kernel) == len(kernel):
        spatial = conv_transpose_geometry(desc, xs[2:], known_kernel).out
    elif desc.output_shape is not None:
        spatial = tuple(desc.output_shape[-len(kernel) :])
    else:
        spatial = (None,) * len(kernel)
    return [TensorInfo((xs[0], m, *spatial), x.dtype)]
