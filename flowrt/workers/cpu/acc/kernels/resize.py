"""Resize and Upsample, nearest and linear, on float32: the output walked as rows of its last
dimension, each gathered from tables of input positions and weights made once per shape.

The tables are CpuRef's own (``source_coordinates``, ``nearest_index``, ``interpolation_taps``),
so every coordinate transformation and nearest rounding CpuRef knows means the same here; the
kernel only gathers. The tensor is seen as planes (every dimension but the last two) of rows:
an output row reads one input row (nearest) or blends two (linear, in CpuRef's order: rows,
then columns), then gathers its columns through the last dimension's table. A nearest row
that reads the same input row as the row before it is a copy of that row. Where the columns
double the row (a 2x upsampling), no gather: nearest stores each value twice, linear
computes the even and the odd outputs each from the row at fixed offsets (the same sums as
the gather, bit for bit) and stores them in pairs. Rows are read and written by index into
the whole arrays, no views: on U-Net's 2x upsamplings (4096 output rows of 64 and 128
values), one thread, linear 259 -> 166 us, nearest 137 -> 71. A resized leading dimension
(rare: scales on N or C) picks, or blends, whole input planes first.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from flowrt.engine.graph.layers.resize import resize_inputs, resize_plan
from flowrt.engine.graph.layers.resize_coordinates import (
    interpolation_taps,
    nearest_index,
    source_coordinates,
)
from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.errors import BackendError
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction, borrowed
from flowrt.workers.cpu.acc.kernels import acc_kernel, float32_data
from flowrt.workers.cpu.acc.kernels.activation import MIN_SLICE


@njit(nogil=True, cache=True)
def _source_plane(x, planes, plane_w, p, size, blended):
    """Output plane ``p``'s input plane: picked, or blended from several into ``blended``."""
    if planes.shape[1] == 1:
        return x[planes[p, 0] * size : (planes[p, 0] + 1) * size]
    blended[:] = 0
    for t in range(planes.shape[1]):
        src, weight = x[planes[p, t] * size : (planes[p, t] + 1) * size], plane_w[p, t]
        for i in range(size):
            blended[i] += src[i] * weight
    return blended


@njit(inline="always", nogil=True, cache=True)
def _interleaved(dst, at, halves, even, odd):
    """``dst[at + 2k] = halves[even, k]``, ``dst[at + 2k + 1] = halves[odd, k]``: a gather
    through the index table stays scalar, these paired stores vectorize. Unsigned indices
    (``at`` too): numba checks signed ones for negatives, which keeps a loop scalar. No
    views: a view (a slice, a row of a 2-D array) costs about 10 ns, more than a short row's
    work, so rows are read and written by index into whole arrays. (Pairs stored as 64-bit
    words through views vectorized too, at three views a row.)"""
    u8 = np.uint64
    for k in range(u8(halves.shape[1])):
        dst[at + u8(2) * k] = halves[even, k]
        dst[at + u8(2) * k + u8(1)] = halves[odd, k]


@njit(inline="always", nogil=True, cache=True)
def _doubled_linear(dst, at, x_at, x_w, offsets, weights, halves):
    """The linear columns of a row doubled (``_doubled_taps``), the row in ``halves[2]``:
    ``dst[at + i] = row[x_at[i, 0]] * x_w[i, 0] + row[x_at[i, 1]] * x_w[i, 1]`` as the gather
    computes it, the even and the odd outputs (into ``halves[0]`` and ``halves[1]``) each by
    unit-stride reads at fixed offsets from ``k`` (``offsets``, the weights of each ``k`` in
    ``weights``), the first and last pairs through the table."""
    iw = halves.shape[1]
    # unsigned indices (see _interleaved), each read at an offset of -1, 0 or 1 from k
    u8, two = np.uint64, np.uint64(2)
    a0, a1, b0, b1 = u8(1 + offsets[0]), u8(1 + offsets[1]), u8(1 + offsets[2]), u8(1 + offsets[3])
    for k in range(u8(1), u8(iw - 1)):
        halves[0, k] = (
            halves[two, k + a0 - u8(1)] * weights[0, k] + halves[two, k + a1 - u8(1)] * weights[1, k]
        )
    for k in range(u8(1), u8(iw - 1)):
        halves[1, k] = (
            halves[two, k + b0 - u8(1)] * weights[2, k] + halves[two, k + b1 - u8(1)] * weights[3, k]
        )
    for k in (0, iw - 1):
        i, j = 2 * k, 2 * k + 1
        halves[0, k] = halves[2, x_at[i, 0]] * x_w[i, 0] + halves[2, x_at[i, 1]] * x_w[i, 1]
        halves[1, k] = halves[2, x_at[j, 0]] * x_w[j, 0] + halves[2, x_at[j, 1]] * x_w[j, 1]
    _interleaved(dst, at, halves, 0, 1)


@njit(nogil=True, cache=True)
def _resize_rows(x, out, planes, plane_w, y_at, y_w, x_at, x_w, offsets, weights, dims, first, last):
    """Output rows ``first .. last`` (of ``ow`` elements, ``oh`` to a plane)."""
    ih, iw, oh, ow = dims[0], dims[1], dims[2], dims[3]
    size = ih * iw
    blended = np.empty(size if planes.shape[1] > 1 else 0, np.float32)
    # the row (and, where linear columns double it, its even and odd outputs)
    halves = np.empty((3 if dims[5] else 1, iw), np.float32)
    current = -1
    src = blended
    u8 = np.uint64
    for r in range(first, last):
        p, oy = divmod(r, oh)
        if p != current:
            src, current = _source_plane(x, planes, plane_w, p, size, blended), p
        o = u8(r * ow)  # the output row, by index of the whole output: a slice per row costs
        if y_at.shape[1] == 1 and oy > 0 and r > first and y_at[oy, 0] == y_at[oy - 1, 0]:
            before = o - u8(ow)  # the same input row as the row before: a copy
            for i in range(u8(ow)):
                out[o + i] = out[before + i]
            continue
        a, line = u8(y_at[oy, 0] * iw), u8(2 if dims[5] else 0)  # the row in halves[line]
        if y_at.shape[1] == 1:
            for i in range(u8(iw)):
                halves[line, i] = src[a + i]
        else:
            b, wa, wb = u8(y_at[oy, 1] * iw), y_w[oy, 0], y_w[oy, 1]
            for i in range(u8(iw)):
                halves[line, i] = src[a + i] * wa + src[b + i] * wb
        # borrowed: each inlined call kept a reference count update per array and row
        if dims[4]:
            _interleaved(borrowed(out), o, borrowed(halves), line, line)
        elif dims[5]:
            _doubled_linear(
                borrowed(out), o, borrowed(x_at), borrowed(x_w), borrowed(offsets), borrowed(weights),
                borrowed(halves),
            )  # fmt: skip
        elif x_at.shape[1] == 1:
            for i in range(ow):
                out[o + u8(i)] = halves[line, x_at[i, 0]]
        else:
            for i in range(ow):
                out[o + u8(i)] = halves[line, x_at[i, 0]] * x_w[i, 0] + halves[line, x_at[i, 1]] * x_w[i, 1]


@njit(**NATIVE)
def _resize_slice(s, _step, bounds, x, out, planes, plane_w, y_at, y_w, x_at, x_w, offsets, weights, dims):
    """Slice ``s`` of :data:`_RESIZE` (a ``SliceFunction``): output rows ``bounds[s]`` to
    ``bounds[s + 1]``."""
    _resize_rows(
        x, out, planes, plane_w, y_at, y_w, x_at, x_w, offsets, weights, dims, bounds[s], bounds[s + 1]
    )


_RESIZE = SliceFunction(_resize_slice)


def _resize_parallel(x, out, planes, plane_w, y_at, y_w, x_at, x_w, offsets, weights, dims, bounds):
    """Every slice of output rows, spread over the workers."""
    args = (bounds, x, out, planes, plane_w, y_at, y_w, x_at, x_w, offsets, weights, dims)
    _RESIZE.run(bounds.shape[0] - 1, args)


class _Axis(NamedTuple):
    """Per output position along one dimension: the input positions it reads, and weights."""

    at: np.ndarray  # (out, taps) int64
    weights: np.ndarray  # (out, taps) float32; taps is 1 for nearest and unmoved dimensions


def _axis(desc, in_len: int, out_len: int, scale: float, moves: bool) -> _Axis:
    """One dimension's table, as CpuRef's ``resize_axis`` reads it."""
    if not moves:
        return _Axis(np.arange(out_len, dtype=np.int64)[:, None], np.ones((out_len, 1), np.float32))
    coords = source_coordinates(desc, out_len, in_len, scale, None)
    if desc.mode == "nearest":
        at = np.clip(nearest_index(desc, coords, scale), 0, in_len - 1).astype(np.int64)
        return _Axis(at[:, None], np.ones((out_len, 1), np.float32))
    at, weights = interpolation_taps(desc, coords, in_len, scale)
    return _Axis(np.ascontiguousarray(at, np.int64), np.ascontiguousarray(weights, np.float32))


def _planes(axes: list[_Axis], in_shape) -> _Axis:
    """The leading dimensions' tables combined: per output plane, the input planes it reads
    (every combination of one position per dimension) and the products of their weights."""
    at, weights = np.zeros((1, 1), np.int64), np.ones((1, 1), np.float32)
    for axis, n in zip(axes, in_shape, strict=True):
        taps = axis.at.shape[1]
        at = (at[:, None, :, None] * n + axis.at[None, :, None, :]).reshape(-1, at.shape[1] * taps)
        weights = (weights[:, None, :, None] * axis.weights[None, :, None, :]).reshape(at.shape)
    return _Axis(np.ascontiguousarray(at), np.ascontiguousarray(weights, np.float32))


def _is_doubled(columns: _Axis, in_len: int) -> bool:
    """Whether nearest columns read input column ``i // 2`` at output column ``i``, all of them."""
    at = columns.at
    return at.shape == (2 * in_len, 1) and bool(np.array_equal(at[:, 0], np.arange(2 * in_len) // 2))


_NO_OFFSETS, _NO_WEIGHTS = np.zeros(4, np.int64), np.zeros((4, 0), np.float32)


def _doubled_taps(columns: _Axis, in_len: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Where linear columns double the row (``2 * in_len`` outputs, each of the two at ``2k``
    and ``2k + 1`` blending two input columns at offsets from ``k`` that are the same for
    every ``k`` but the first and the last, as a 2x upsampling does): the four offsets (the
    even output's two taps, the odd one's) and the weights of each ``k`` (4, ``in_len``);
    else None."""
    at, weights = columns.at, columns.weights
    if at.shape != (2 * in_len, 2) or in_len < 3:
        return None
    k = np.arange(in_len)
    relative = [at[parity::2, tap] - k for parity in (0, 1) for tap in (0, 1)]
    if any(np.any(r[1:-1] != r[1]) or abs(int(r[1])) > 1 for r in relative):
        return None
    offsets = np.array([int(r[1]) for r in relative], np.int64)
    taps = np.stack([weights[parity::2, tap] for parity in (0, 1) for tap in (0, 1)])
    return offsets, np.ascontiguousarray(taps, np.float32)


class _Plan(NamedTuple):
    """How one input shape and scale run."""

    out_shape: tuple[int, ...]
    planes: _Axis
    rows: _Axis
    columns: _Axis
    # _doubled_taps's offsets and weights, where linear columns double the row (else empty)
    doubled: tuple[np.ndarray, np.ndarray]
    # ih, iw, oh, ow, 1 where each input column is output twice in turn, 1 where linear
    # columns double the row
    dims: np.ndarray
    bounds: np.ndarray  # output rows per slice


def _whole(roi, axis: int, rank: int) -> bool:
    """Whether the region of interest spans all of ``axis`` (CpuRef leaves such an axis alone)."""
    return roi is None or (math.isclose(roi[axis], 0.0) and math.isclose(roi[axis + rank], 1.0))


@acc_kernel("Resize", "Upsample")
class ResizeKernel:
    """Nearest (every rounding) and linear Resize and Upsample on float32, under every
    coordinate transformation but tf_crop_and_resize; scales or sizes are read at run time,
    and their tables made once per value."""

    split_hint = SplitHint(axis=0, min_slice=MIN_SLICE)  # output elements per slice, as rows

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        support = float32_data(info)
        x = info.inputs[0]
        if not support.supported:
            return support
        if x is not None and x.rank == 0:
            return Support.no(f"CpuAcc {info.kind} takes tensors of rank 1 or more")
        if info.kind == "Upsample":
            return Support.yes()
        desc = info.descriptor
        if desc.mode == "cubic":
            return Support.no("CpuAcc Resize takes nearest and linear modes only, not cubic")
        if desc.mode == "linear" and desc.antialias:
            return Support.no("CpuAcc Resize does not take antialias (linear taps that widen as it shrinks)")
        if not desc.legacy and desc.coordinate_transformation_mode == "tf_crop_and_resize":
            return Support.no(
                "CpuAcc Resize does not take tf_crop_and_resize (extrapolation outside the roi)"
            )
        return Support.yes()

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        if info.activation is not None:
            raise BackendError(f"CpuAcc {info.kind} {info.layer_name!r} cannot apply a fused activation")
        self.info = info
        self.workers = workers
        upsample = info.kind == "Upsample"
        self.desc = info.descriptor.as_resize() if upsample else info.descriptor
        self._plans: dict[tuple, _Plan] = {}

    def _sizing(self, x_shape, args) -> tuple[list[int], list[float], list | None]:
        """(output shape, scale per dimension, roi or None) from the inputs after the data."""
        if self.info.kind == "Upsample":
            factors = self.info.descriptor.scale_values(args[0] if args else None)
            if factors is None or len(factors) != len(x_shape):
                raise BackendError(f"Upsample {self.info.layer_name!r}: one scale per dimension expected")
            return [int(np.floor(d * f)) for d, f in zip(x_shape, factors, strict=True)], factors, None
        roi, scales, sizes = resize_inputs(self.desc, args)
        out, factors, roi = resize_plan(self.desc, x_shape, roi, scales, sizes)
        return [int(d) for d in out], [float(f) for f in factors], roi

    def plan(self, x_shape: tuple[int, ...], args) -> _Plan:
        """The tables and split for one input shape and scale, computed once."""
        key = (
            x_shape,
            *(None if a is None else (np.asarray(a).dtype.str, np.asarray(a).tobytes()) for a in args),
        )
        cached = self._plans.get(key)
        if cached is not None:
            return cached
        out, factors, roi = self._sizing(x_shape, args)
        rank = len(x_shape)
        axes = [
            _axis(
                self.desc, x_shape[a], out[a], factors[a],
                not (math.isclose(factors[a], 1.0) and out[a] == x_shape[a] and _whole(roi, a, rank)),
            )
            for a in range(rank)
        ]  # fmt: skip
        if rank == 1:  # one row: a plane of one row
            axes.insert(0, _axis(self.desc, 1, 1, 1.0, False))
        in_dims, out_dims = (list(x_shape) if rank > 1 else [1, *x_shape]), (out if rank > 1 else [1, *out])
        rows = int(np.prod(out_dims[:-1]))
        min_rows = max(1, self.split_hint.min_slice // max(1, out_dims[-1]))
        doubled = _doubled_taps(axes[-1], in_dims[-1])
        cached = self._plans[key] = _Plan(
            tuple(out),
            _planes(axes[:-2], in_dims[:-2]),
            axes[-2],
            axes[-1],
            (_NO_OFFSETS, _NO_WEIGHTS) if doubled is None else doubled,
            np.array(
                [*in_dims[-2:], *out_dims[-2:], _is_doubled(axes[-1], in_dims[-1]), doubled is not None],
                np.int64,
            ),
            split_bounds(rows, SplitHint(0, min_rows), self.workers),
        )
        return cached

    def execute(self, inputs, outputs=None):
        x = np.ascontiguousarray(inputs[0], np.float32)
        plan = self.plan(x.shape, list(inputs[1:]))
        out = np.empty(plan.out_shape, np.float32) if outputs is None else outputs[0]
        if out.size == 0:
            return [out]
        if x.size == 0:
            raise BackendError(
                f"{self.info.kind} {self.info.layer_name!r}: cannot resize an empty {x.shape} to {out.shape}"
            )
        args = (*plan.planes, *plan.rows, *plan.columns, *plan.doubled, plan.dims)
        flat_x, flat_out = x.reshape(-1), out.reshape(-1)
        if len(plan.bounds) > 2:
            _resize_parallel(flat_x, flat_out, *args, plan.bounds)
        else:
            _resize_rows(flat_x, flat_out, *args, 0, int(plan.bounds[-1]))
        return [out]
