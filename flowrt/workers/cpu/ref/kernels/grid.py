"""GridSample and AffineGrid kernels.

GridSample follows onnx's reference implementation (itself PyTorch's ``grid_sampler``) step by
step, vectorized over the output points: coordinates are denormalized, rounded half to even
for nearest, brought back inside by the padding mode, then each interpolation tap (2 per dim
for linear, 4 for cubic) reads a pixel, again through the padding mode. The taps of all dims
are combined as a product of per-dim weights.
"""

from __future__ import annotations

import itertools

import numpy as np

from flowrt.engine.graph.layers.grid import affine_grid_dims
from flowrt.errors import ShapeError
from flowrt.types import TensorInfo
from flowrt.workers.cpu.ref.kernels import ref_kernel

# Keys' cubic convolution constant, as PyTorch and onnx's reference use it.
_CUBIC_A = -0.75


def _reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """``x`` mirrored at ``lo`` and ``hi`` (repeatedly) until it lies between them."""
    span = hi - lo
    if span <= 0:  # a one-pixel axis with align_corners: every point is that pixel
        return np.full_like(x, lo)
    below, above = x < lo, x > hi
    distance = np.where(below, lo - x, x - hi)
    turns = np.trunc(distance / span)
    rest = distance - turns * span
    even = turns % 2 == 0
    mirrored = np.where(below == even, lo + rest, hi - rest)
    return np.where(below | above, mirrored, x)


def _cubic_weights(t: np.ndarray) -> list[np.ndarray]:
    """The weights of taps x0-1 .. x0+2 for a point ``t`` past x0 (0 <= t < 1)."""
    a = _CUBIC_A
    far = [t + 1, 2 - t]  # distances to the outer taps

    def outer(d):
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    def inner(d):
        return ((a + 2) * d - (a + 3)) * d * d + 1

    return [outer(far[0]), inner(t), inner(1 - t), outer(far[1])]


class _Axis:
    """One spatial axis of X: its length and where its samples may lie."""

    def __init__(self, length: int, align_corners: bool, padding_mode: str):
        self.length, self.padding_mode = length, padding_mode
        self.lo, self.hi = (0.0, length - 1.0) if align_corners else (-0.5, length - 0.5)
        self.align_corners = align_corners

    def coordinates(self, normalized: np.ndarray, nearest: bool) -> np.ndarray:
        """Pixel coordinates of normalized ones, brought inside by the padding mode."""
        n = self.length
        x = (normalized + 1) / 2 * (n - 1) if self.align_corners else ((normalized + 1) * n - 1) / 2
        if nearest:
            x = np.rint(x)  # half to even, as PyTorch
        outside = (x < self.lo) | (x > self.hi)
        if self.padding_mode == "border":
            x = np.where(outside, np.clip(x, 0, n - 1), x)
        elif self.padding_mode == "reflection":
            x = np.where(outside, _reflect(x, self.lo, self.hi), x)
        return x

    def pixel(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(index to read, whether it is on the image) of an integer tap position; the mask is
        None when every tap reads a pixel (border and reflection padding)."""
        last = self.length - 1
        if self.padding_mode == "zeros":
            return np.clip(index, 0, last), (index >= 0) & (index <= last)
        if self.padding_mode == "reflection":
            index = np.trunc(_reflect(index.astype(np.float64), self.lo, self.hi)).astype(np.int64)
        return np.clip(index, 0, last), None

    def taps(self, x: np.ndarray, mode: str) -> list[tuple[np.ndarray, np.ndarray | None, np.ndarray | None]]:
        """(pixel index, on-image mask, weight) of each tap of the points ``x``."""
        if mode == "nearest":
            index, valid = self.pixel(np.trunc(x).astype(np.int64))
            return [(index, valid, None)]
        first = np.floor(x)
        t = x - first
        if mode == "linear":
            offsets, weights = [0, 1], [1 - t, t]
        else:
            offsets, weights = [-1, 0, 1, 2], _cubic_weights(t)
        start = first.astype(np.int64)
        return [(*self.pixel(start + o), w) for o, w in zip(offsets, weights)]


def _check_grid(x: np.ndarray, grid: np.ndarray) -> None:
    spatial = x.ndim - 2
    if grid.ndim != spatial + 2 or grid.shape[0] != x.shape[0] or grid.shape[-1] != spatial:
        raise ShapeError(
            f"GridSample: grid [N={x.shape[0]}, *output dims, {spatial}] expected for X {x.shape}, got {grid.shape}"
        )
    if grid[..., 0].size and 0 in x.shape[2:]:
        raise ShapeError(f"GridSample: cannot sample an image with an empty spatial dim, X is {x.shape}")


@ref_kernel("GridSample")
def grid_sample(desc, x: np.ndarray, grid: np.ndarray) -> np.ndarray:
    _check_grid(x, grid)
    batch, channels, *dims = x.shape
    mode = desc.interpolation
    out_dims = grid.shape[1:-1]
    compute = np.float64 if np.float64 in (x.dtype, grid.dtype) else np.float32
    points = grid.reshape(batch, -1, len(dims)).astype(compute)
    axes = [_Axis(n, bool(desc.align_corners), desc.padding_mode) for n in dims]
    # The grid lists coordinates in reverse dim order: x (the last dim) first.
    taps = [
        axis.taps(axis.coordinates(points[..., len(dims) - 1 - i], mode == "nearest"), mode)
        for i, axis in enumerate(axes)
    ]
    flat_x = x.reshape(batch, channels, -1)
    values = x.dtype if mode == "nearest" else compute
    out = np.zeros((batch, channels, points.shape[1]), values)
    for combination in itertools.product(*taps):
        flat = np.zeros(points.shape[:2], np.int64)
        weight: np.ndarray | float = 1.0
        valid = np.ones(points.shape[:2], bool)
        for (index, on_image, w), n in zip(combination, dims):
            flat = flat * n + index
            valid = valid if on_image is None else valid & on_image
            weight = weight if w is None else weight * w
        read = np.take_along_axis(flat_x, flat[:, None, :], axis=2)
        if mode == "nearest":
            out = np.where(valid[:, None, :], read, out)
        else:
            out += np.where(valid, weight, 0)[:, None, :].astype(compute) * read
    return out.reshape(batch, channels, *out_dims).astype(x.dtype)


def _base_axis(length: int, align_corners: bool) -> np.ndarray:
    """Normalized coordinates of the pixels of one output axis. A one-pixel axis with
    align_corners sits at -1, as in onnx's reference (the spec leaves it open; PyTorch puts
    it at 0, ONNX Runtime at 1)."""
    if align_corners:
        return np.linspace(-1.0, 1.0, length)
    step = 2.0 / length if length else 0.0
    return -1 + step / 2 + np.arange(length) * step


@ref_kernel("AffineGrid")
def affine_grid(desc, theta, size):
    sizes = [int(v) for v in size.reshape(-1)]
    grid_dims = affine_grid_dims(TensorInfo.of(theta), TensorInfo.of(size), sizes)
    assert grid_dims is not None  # known with the values of size
    spatial = theta.shape[1]
    axes = [_base_axis(n, bool(desc.align_corners)) for n in sizes[2:]]
    mesh = np.meshgrid(*axes, indexing="ij") if axes else []
    # Homogeneous point (x, y[, z], 1): the last dim's coordinate first.
    points = np.stack([*mesh[::-1], np.ones(mesh[0].shape)], axis=-1).reshape(-1, spatial + 1)
    grid = points @ theta.astype(np.float64).transpose(0, 2, 1)
    return grid.reshape(grid_dims).astype(theta.dtype)
