"""Stride-1 Conv for CpuAcc with few output channels, one GEMM per kernel tap.

The input is copied once into a zero-padded plane per channel, and each kernel tap is one GEMM
of that tap's weights by the padded planes read from the tap's offset, accumulated into the
output block (outputs are computed on the padded plane's row pitch, the extra columns
dropped). im2col writes and reads back kh*kw copies of the input for every output block, which
costs more than the GEMM itself when there are only a few dozen output channels to share it.
Its algorithm, :class:`Taps`, takes such convs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import attrs
import numpy as np
from numba import njit

from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.workers.cpu.acc.blas import NATIVE, SliceFunction, run_stages, sgemm
from flowrt.workers.cpu.acc.calls import borrowed
from flowrt.workers.cpu.acc.kernels.epilogue import NO_BIAS, activate_row

if TYPE_CHECKING:
    from flowrt.workers.cpu.acc.conv.algorithms import ActArgs
    from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
    from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
    from flowrt.workers.cpu.acc.conv.weights import ConvWeights


# Its parallel loops are SliceFunctions, called by address from the one shared parallel loop
# (``calls.py``): as prange loops of its own, this kernel took 13 s to compile on a cold cache.


@njit(**NATIVE)
def _pad_channels(task, n, x, padded, rows, pitch, ph, pw, chunks):
    """Image ``n``'s channels, the ``task``-th of ``chunks`` runs of them, into the interior of
    their zero-padded planes (flat ``x`` (N, C, H, W) and ``padded``: per channel ``rows`` rows
    of ``pitch``), a row at a time by unsigned offsets."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    xf = x.reshape(-1)
    for c in range(task * channels // chunks, (task + 1) * channels // chunks):
        for ih in range(height):
            o = np.uint64((c * rows + ph + ih) * pitch + pw)
            s = np.uint64(((n * channels + c) * height + ih) * width)
            for iw in range(np.uint64(width)):
                padded[o + iw] = xf[s + iw]


@njit(**NATIVE)
def _taps_slice(s, n, w_taps, bias, out, geo, flat, pitch, row_bounds, block_rows, finish, code, alpha, beta):
    """Image ``n``'s slice ``s`` of output rows (see :func:`conv_by_taps`), ``block_rows``
    rows at a time: one GEMM per kernel tap reading the padded planes ``flat`` (C, rows *
    pitch) at the tap's offset, then bias and activation as the block's rows are copied out."""
    kh, kw, dh, dw = geo[0], geo[1], geo[4], geo[5]
    m_count, ow_count = out.shape[1], out.shape[3]
    start, stop = row_bounds[s], row_bounds[s + 1]
    block = np.empty((m_count, block_rows * pitch), np.float32)
    for r0 in range(start, stop, block_rows):
        r1 = min(r0 + block_rows, stop)
        q0, q1 = r0 * pitch, (r1 - 1) * pitch + ow_count
        acc = block[:, : q1 - q0]
        for t in range(kh * kw):
            offset = (t // kw) * dh * pitch + (t % kw) * dw
            sgemm(False, False, 1.0, w_taps[t], flat[:, q0 + offset : q1 + offset], 1.0 if t else 0.0, acc)
        for m in range(m_count):
            b = bias[m] if finish else NO_BIAS
            for r in range(r0, r1):
                src = block[m, (r - r0) * pitch : (r - r0) * pitch + ow_count]
                # borrowed: the inlined row loops kept a reference count update per row
                activate_row(borrowed(out[n, m, r]), borrowed(src), b, code, alpha, beta)


_PAD_CHANNELS = SliceFunction(_pad_channels)
_TAPS_SLICE = SliceFunction(_taps_slice)


def conv_by_taps(x, w_taps, bias, out, geo, padded_shape, row_bounds, block_rows, finish, code, alpha, beta):
    """Stride 1, one group: every image is copied into zero-padded planes (a run of channels
    per slice), then each slice of output rows is computed ``block_rows`` rows at a time, one
    GEMM per kernel tap (``w_taps``: (kh*kw, M, C)) reading the planes at the tap's offset;
    bias and activation are applied as each block's rows are copied out."""
    channels = x.shape[1]
    rows, pitch = int(padded_shape[0]), int(padded_shape[1])
    padded = np.zeros((channels, rows * pitch), np.float32)  # pad cells stay zero
    slices = row_bounds.shape[0] - 1
    chunks = min(channels, slices)  # as many as there are slices
    pad = (x, padded.reshape(-1), rows, pitch, int(geo[6]), int(geo[7]), chunks)
    taps = (w_taps, bias, out, geo, padded, pitch, row_bounds, block_rows, finish, code, alpha, beta)
    run_stages(x.shape[0], _PAD_CHANNELS.address(pad), chunks, pad, _TAPS_SLICE.address(taps), slices, taps)


@attrs.frozen(eq=False)
class Taps:
    """Plan of a conv by :func:`conv_by_taps`: ``row_bounds`` output rows per slice,
    ``block_rows`` per block, over planes padded to ``padded_shape`` (rows, pitch)."""

    name: ClassVar[str] = "taps"
    geo: np.ndarray
    padded_shape: np.ndarray
    row_bounds: np.ndarray
    block_rows: int

    @classmethod
    def applies(cls, geometry: ConvGeometry, tuning: ConvTuning) -> bool:
        """Stride 1, one group, not 1x1 unpadded, at most ``tuning.taps_max_rows`` output
        channels."""
        return (
            geometry.groups == 1
            and geometry.unit_strides
            and not geometry.direct
            and geometry.mg <= tuning.taps_max_rows
        )

    @classmethod
    def plan(cls, geometry: ConvGeometry, tuning: ConvTuning) -> Taps:
        """The padded plane, the output rows split over the workers, and blocks of them that
        keep the output block near ``tuning.taps_block_floats``."""
        g, (kh, kw), (oh, ow) = geometry.window, geometry.kernel, geometry.out_hw
        x_shape = geometry.x_shape
        padded_shape = np.array(
            [
                max(x_shape[2] + g.pads_begin[0], oh + (kh - 1) * g.dilations[0]),
                max(x_shape[3] + g.pads_begin[1], ow + (kw - 1) * g.dilations[1]),
            ],
            np.int64,
        )
        row_bounds = split_bounds(oh, SplitHint(0, 1), geometry.workers)
        block_rows = max(
            1, min(int(row_bounds[1]), tuning.taps_block_floats // (geometry.mg * int(padded_shape[1])))
        )
        return cls(geometry.geo(), padded_shape, row_bounds, block_rows)

    def forms(self, weights: ConvWeights, w, w_shape, bias, constant: bool) -> None:
        """See ``algorithms.ConvAlgorithm``."""
        weights.taps(w, w_shape)

    def run(
        self, weights: ConvWeights, x, w, w_shape, bias, out, finish: bool, constant: bool, act: ActArgs
    ) -> None:
        """See ``algorithms.ConvAlgorithm.run``."""
        w_taps = weights.taps(w, w_shape)
        conv_by_taps(
            x, w_taps, bias, out, self.geo, self.padded_shape, self.row_bounds, self.block_rows, finish, *act
        )
