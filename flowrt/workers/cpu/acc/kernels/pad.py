"""Pad in every mode (constant, reflect, edge, wrap), negative pads too, any data type.

Each output dimension gets an index map from output to input index: ``np.pad`` of the
input's (cropped) index range in the layer's own mode, -1 where a constant goes. The output
is then walked as rows: a row whose outer indices all map into the input gathers its elements
through the last dimension's map, any other row is the constant.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flowrt.engine.graph.layers.pad import PadMode, pad_widths
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.errors import BackendError
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.acc.kernels.strided import (
    as_index,
    as_words,
    contiguous_strides,
    has_word_size,
    row_bounds,
)


@njit(nogil=True, cache=True)
def _pad_rows(x, out, maps, map_starts, outer, in_strides, inner, value, first, last):
    """Output rows ``first`` to ``last``; ``maps[map_starts[d]:]`` maps dimension ``d``."""
    rank = outer.shape[0]
    last_map = maps[map_starts[rank] : map_starts[rank] + inner]
    for r in range(first, last):
        d = out[r * inner : (r + 1) * inner]
        src, rest, inside = 0, r, True
        for k in range(rank - 1, -1, -1):
            i = maps[map_starts[k] + rest % outer[k]]
            rest //= outer[k]
            if i < 0:
                inside = False
                break
            src += i * in_strides[k]
        if not inside:
            for j in range(inner):
                d[j] = value
            continue
        for j in range(inner):
            i = last_map[j]
            d[j] = x[src + i] if i >= 0 else value


@njit(**NATIVE)
def _pad_slice(s, _step, bounds, x, out, maps, map_starts, outer, in_strides, inner, value):
    """Slice ``s`` of :data:`_PAD` (a ``SliceFunction``)."""
    _pad_rows(x, out, maps, map_starts, outer, in_strides, inner, value, bounds[s], bounds[s + 1])


_PAD = SliceFunction(_pad_slice)


def _pad(x, out, maps, map_starts, outer, in_strides, inner, value, bounds):
    """Every slice of ``bounds``, spread over the workers (one on the calling thread)."""
    _PAD.run(bounds.shape[0] - 1, (bounds, x, out, maps, map_starts, outer, in_strides, inner, value))


def index_map(size: int, begin: int, end: int, mode: PadMode) -> np.ndarray:
    """Input index of each output index along one dimension; -1 for the constant."""
    kept = np.arange(max(-begin, 0), size - max(-end, 0), dtype=np.int64)
    grow = (max(begin, 0), max(end, 0))
    if mode == "constant":
        return np.pad(kept, grow, mode="constant", constant_values=-1)
    return np.pad(kept, grow, mode=mode)  # ONNX's mode names are numpy's


class PadWalk:
    """The index maps and row grid of one padding of one input shape."""

    def __init__(self, shape, widths, mode: PadMode, workers: int) -> None:
        maps = [index_map(n, b, e, mode) for n, (b, e) in zip(shape, widths, strict=True)]
        self.shape = tuple(len(m) for m in maps)
        strides = contiguous_strides(shape)[:-1]
        if len(maps) == 1:  # one dimension: a single row, under an outer dimension of 1
            maps, strides = [np.zeros(1, np.int64), *maps], [0]
        self.maps = np.concatenate(maps)
        self.map_starts = as_index(np.cumsum([0] + [len(m) for m in maps[:-1]]))
        self.outer = as_index([len(m) for m in maps[:-1]])
        self.in_strides = as_index(strides)
        self.inner = len(maps[-1])
        self.bounds = row_bounds(int(np.prod(self.outer)), self.inner, workers)


@acc_kernel("Pad")
class PadKernel:
    """Pad split into row slices across the CPU workers."""

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        x = info.inputs[0]
        if x is None or not has_word_size(x.dtype.numpy):
            return Support.no("CpuAcc Pad takes data types of 1, 2, 4 or 8 bytes only")
        if x.shape is not None and len(x.shape) == 0:
            return Support.no("CpuAcc Pad takes tensors of rank 1 or more")
        return Support.yes()

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        if info.activation is not None:
            raise BackendError(f"CpuAcc Pad {info.layer_name!r} cannot apply a fused activation")
        self.info = info
        self.workers = workers
        self._walks: dict[tuple, PadWalk] = {}

    def widths(self, x, pads, axes) -> tuple[tuple[int, int], ...]:
        """(begin, end) per axis, from the attribute (old opsets) or the pads input."""
        desc = self.info.descriptor
        counts = list(desc.pads_attribute) if desc.pads_attribute is not None else const_ints(pads)
        assert counts is not None  # pads are an attribute (old opsets) or an input
        return tuple(pad_widths(x.ndim, counts, const_ints(axes)))

    def fill(self, x, constant_value) -> np.ndarray:
        """The constant as one word of ``x``'s size, as CpuRef reads it."""
        desc = self.info.descriptor
        if desc.pads_attribute is not None:
            value = desc.value
        elif constant_value is None or constant_value.size == 0:
            value = 0
        else:
            value = constant_value.reshape(-1)[0]
        return as_words(np.asarray(value).astype(x.dtype).reshape(1))[0]

    def execute(self, inputs, outputs=None):
        x, pads, constant_value, axes = (list(inputs) + [None] * 4)[:4]
        x = np.asarray(x, order="C")
        key = (x.shape, self.widths(x, pads, axes))
        walk = self._walks.get(key)
        if walk is None:
            walk = self._walks[key] = PadWalk(x.shape, key[1], self.info.descriptor.mode, self.workers)
        out = np.empty(walk.shape, x.dtype) if outputs is None else outputs[0]
        if out.size:
            w = walk
            _pad(
                as_words(x), as_words(out), w.maps, w.map_starts, w.outer, w.in_strides,
                w.inner, self.fill(x, constant_value), w.bounds,
            )  # fmt: skip
        return [out]
