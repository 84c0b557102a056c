"""Resize and Upsample, nearest and linear, on float32: the output walked as rows of its last
dimension, each gathered from tables of input positions and weights made once per shape.

The tables are CpuRef's own (``source_coordinates``, ``nearest_index``, ``interpolation_taps``),
so every coordinate transformation and nearest rounding CpuRef knows means the same here; the
kernel only gathers. The tensor is seen as planes (every dimension but the last two) of rows:
an output row reads one input row (nearest) or blends two (linear, in CpuRef's order: rows,
then columns), then gathers its columns through the last dimension's table. A nearest row
that reads the same input row as the row before it is a copy of that row. A resized leading
dimension (rare: scales on N or C) picks, or blends, whole input planes first.
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
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
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
def _doubled(dst, row):
    """``dst[2i] = dst[2i + 1] = row[i]``, each pair stored as one 64-bit word: a gather
    through the index table stays scalar, this vectorizes (little-endian, as phases.py)."""
    bits, words = row.view(np.uint32), dst.view(np.uint64)
    for i in range(words.shape[0]):
        v = np.uint64(bits[i])
        words[i] = v | (v << np.uint64(32))


@njit(nogil=True, cache=True)
def _resize_rows(x, out, planes, plane_w, y_at, y_w, x_at, x_w, dims, first, last):
    """Output rows ``first .. last`` (of ``ow`` elements, ``oh`` to a plane)."""
    ih, iw, oh, ow = dims[0], dims[1], dims[2], dims[3]
    size = ih * iw
    blended = np.empty(size if planes.shape[1] > 1 else 0, np.float32)
    line = np.empty(iw, np.float32)
    current = -1
    src = blended
    for r in range(first, last):
        p, oy = divmod(r, oh)
        if p != current:
            src, current = _source_plane(x, planes, plane_w, p, size, blended), p
        dst = out[r * ow : (r + 1) * ow]
        if y_at.shape[1] == 1 and oy > 0 and r > first and y_at[oy, 0] == y_at[oy - 1, 0]:
            # the same input row as the row before: a copy (a loop: ``dst[:] = view`` compiles
            # numba's shape-mismatch error, seconds of it)
            before = out[(r - 1) * ow : r * ow]
            for i in range(ow):
                dst[i] = before[i]
            continue
        a = y_at[oy, 0] * iw
        if y_at.shape[1] == 1:
            row = src[a : a + iw]
        else:
            b, wa, wb = y_at[oy, 1] * iw, y_w[oy, 0], y_w[oy, 1]
            above, below = src[a : a + iw], src[b : b + iw]  # loops over views vectorize
            for i in range(iw):
                line[i] = above[i] * wa + below[i] * wb
            row = line
        if dims[4]:
            _doubled(dst, row)
        elif x_at.shape[1] == 1:
            for i in range(ow):
                dst[i] = row[x_at[i, 0]]
        else:
            for i in range(ow):
                dst[i] = row[x_at[i, 0]] * x_w[i, 0] + row[x_at[i, 1]] * x_w[i, 1]


@njit(**NATIVE)
def _resize_slice(s, _step, bounds, x, out, planes, plane_w, y_at, y_w, x_at, x_w, dims):
    """Slice ``s`` of :data:`_RESIZE` (a ``SliceFunction``): output rows ``bounds[s]`` to
    ``bounds[s + 1]``."""
    _resize_rows(x, out, planes, plane_w, y_at, y_w, x_at, x_w, dims, bounds[s], bounds[s + 1])


_RESIZE = SliceFunction(_resize_slice)


def _resize_parallel(x, out, planes, plane_w, y_at, y_w, x_at, x_w, dims, bounds):
    """Every slice of output rows, spread over the workers."""
    _RESIZE.run(bounds.shape[0] - 1, (bounds, x, out, planes, plane_w, y_at, y_w, x_at, x_w, dims))


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


class _Plan(NamedTuple):
    """How one input shape and scale run."""

    out_shape: tuple[int, ...]
    planes: _Axis
    rows: _Axis
    columns: _Axis
    dims: np.ndarray  # ih, iw, oh, ow, and 1 where each input column is output twice in turn
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
        cached = self._plans[key] = _Plan(
            tuple(out),
            _planes(axes[:-2], in_dims[:-2]),
            axes[-2],
            axes[-1],
            np.array([*in_dims[-2:], *out_dims[-2:], _is_doubled(axes[-1], in_dims[-1])], np.int64),
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
        args = (*plan.planes, *plan.rows, *plan.columns, plan.dims)
        flat_x, flat_out = x.reshape(-1), out.reshape(-1)
        if len(plan.bounds) > 2:
            _resize_parallel(flat_x, flat_out, *args, plan.bounds)
        else:
            _resize_rows(flat_x, flat_out, *args, 0, int(plan.bounds[-1]))
        return [out]
