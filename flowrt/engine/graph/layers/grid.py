"""GridSample and AffineGrid: sampling an image at the points of a grid, and the grid an affine
transform makes (together, a spatial transformer).

A grid holds, per output point, normalized coordinates in [-1, 1] in reverse dim order (x, y[,
z]: the width first). ``align_corners`` 1 puts -1 and 1 on the centers of the corner pixels, 0
on their outer edges.
"""

from __future__ import annotations

import attrs

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.detection import expect_dims
from flowrt.engine.graph.layers.elementwise import INT_TYPES, expect_dtype
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import DataType, Dim, TensorInfo

# bfloat16 has no numpy dtype, so CpuRef cannot compute in it.
GRID_FLOATS = frozenset({DataType.FLOAT16, DataType.FLOAT32, DataType.FLOAT64})
# Nearest sampling only copies values: any numeric or bool input.
NEAREST_TYPES = GRID_FLOATS | INT_TYPES | {DataType.BOOL}

# Mode names by opset: 16 spelled the 2-D forms (bilinear, bicubic), 20 generalized them.
_MODES_16 = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}
_MODES_20 = {"linear": "linear", "nearest": "nearest", "cubic": "cubic"}


@attrs.frozen
class GridSampleDescriptor:
    """GridSample: each output point is X interpolated (``mode``) at the grid's coordinates;
    a point off the image reads zeros, the nearest border pixel or its mirror image
    (``padding_mode``). Opset 16 takes 4-D X only; 20 and later any spatial rank."""

    opset: int = 22
    mode: str | None = None  # None: the opset's default (bilinear in 16, linear from 20)
    padding_mode: str = attrs.field(
        default="zeros", validator=attrs.validators.in_(("zeros", "border", "reflection"))
    )
    align_corners: int = attrs.field(default=0, validator=attrs.validators.in_((0, 1)))

    def __attrs_post_init__(self) -> None:
        names = _MODES_16 if self.opset < 20 else _MODES_20
        if self.mode is not None and self.mode not in names:
            raise ValueError(
                f"mode must be one of {', '.join(names)} in opset {self.opset}, got {self.mode!r}"
            )

    @property
    def interpolation(self) -> str:
        """The interpolation: "linear", "nearest" or "cubic", whatever the opset calls it."""
        if self.mode is None:
            return "linear"
        return (_MODES_16 if self.opset < 20 else _MODES_20)[self.mode]


@layer_kind("GridSample", GridSampleDescriptor, min_inputs=2, max_inputs=2)
def infer_grid_sample(desc: GridSampleDescriptor, inputs, consts):
    where = "GridSample"
    x, grid = inputs
    allowed = NEAREST_TYPES if desc.interpolation == "nearest" else GRID_FLOATS
    expect_dtype(x, allowed, f"{where} ({desc.interpolation}) input X")
    expect_dtype(grid, GRID_FLOATS, f"{where} input grid")
    if x.shape is not None and (len(x.shape) < 3 or (desc.opset < 20 and len(x.shape) != 4)):
        expected = "4-D [N, C, H, W]" if desc.opset < 20 else "[N, C, D1, ..., Dr] (3-D or more)"
        raise ShapeError(f"{where} (opset {desc.opset}): X {expected} expected, got {x.format_shape()}")
    if x.shape is None or grid.shape is None:
        return [TensorInfo(None, x.dtype)]
    spatial = len(x.shape) - 2
    expect_dims(grid, (x.shape[0], *[None] * spatial, spatial), f"grid [N, *output dims, {spatial}]", where)
    return [TensorInfo((x.shape[0], x.shape[1], *grid.shape[1:-1]), x.dtype)]


@attrs.frozen
class AffineGridDescriptor:
    """AffineGrid: the grid of normalized coordinates that GridSample reads, each an affine
    transform (theta, [N, 2, 3] or [N, 3, 4]) of an output point's own coordinates."""

    align_corners: int = attrs.field(default=0, validator=attrs.validators.in_((0, 1)))


def affine_grid_dims(theta: TensorInfo, size: TensorInfo, size_value) -> tuple[Dim, ...] | None:
    """The grid's shape [N, (D,) H, W, r] for ``theta`` and the output ``size`` (its values when
    known); ShapeError when they do not fit."""
    where = "AffineGrid"
    if theta.shape is not None and (len(theta.shape) != 3 or theta.shape[1] not in (2, 3, None)):
        raise ShapeError(f"{where}: theta [N, 2, 3] or [N, 3, 4] expected, got {theta.format_shape()}")
    spatial = theta.shape[1] if theta.shape is not None else None
    if isinstance(spatial, int):
        expect_dims(theta, (None, spatial, spatial + 1), f"theta [N, {spatial}, {spatial + 1}]", where)
    size_len = size.shape[0] if size.shape is not None and len(size.shape) == 1 else None
    expect_dims(size, (None,), "size (1-D)", where)
    if size_value is not None:
        size_len = len(size_value)
    if isinstance(size_len, int):
        if size_len not in (4, 5) or (isinstance(spatial, int) and size_len != spatial + 2):
            expected = "4 or 5" if not isinstance(spatial, int) else str(spatial + 2)
            raise ShapeError(f"{where}: size of {expected} values [N, C, (D,) H, W] expected, got {size_len}")
        spatial = size_len - 2
    if not isinstance(spatial, int):
        return None
    batch = theta.shape[0] if theta.shape is not None else None
    if size_value is None:
        return (batch, *[None] * spatial, spatial)
    if any(v < 0 for v in size_value) or (isinstance(batch, int) and size_value[0] != batch):
        raise ShapeError(f"{where}: size {size_value} must be non-negative and start with theta's N {batch}")
    return (size_value[0], *size_value[2:], spatial)


@layer_kind("AffineGrid", AffineGridDescriptor, min_inputs=2, max_inputs=2)
def infer_affine_grid(desc: AffineGridDescriptor, inputs, consts):
    theta, size = inputs
    expect_dtype(theta, GRID_FLOATS, "AffineGrid input theta")
    if size.dtype is not DataType.INT64:
        raise DataTypeError(f"AffineGrid: size of type int64 expected, got {size.dtype.name.lower()}")
    return [TensorInfo(affine_grid_dims(theta, size, const_ints(consts[1])), theta.dtype)]
