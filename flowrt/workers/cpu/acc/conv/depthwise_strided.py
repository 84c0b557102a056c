"""3x3 and 5x5 depthwise convs with stride 2 and the symmetric padding of a "same" conv (the
downsampling blocks of every mobile net): all taps of an output in one loop over the output
plane. Its algorithm is :class:`DepthwiseStrided2`.

With stride 2, input row ``2 * oh + d`` (d = di - pad) is row ``oh + d // 2`` of the phase
plane of rows ``d % 2``, and likewise for columns. So the input plane is split once into its
four phase planes, each stored on the output plane's own pitch with zero rows above and
below; every tap of every output is then a read at a fixed offset from the output's index,
one loop over the output plane that LLVM vectorizes, with per-output masks dropping the taps
whose column falls off a row's end (as ``depthwise_same5.py`` does at stride 1). The general
depthwise path instead makes one pass per kernel row over padded phase planes on a wider
pitch, then copies the result out. The phase planes are filled one input row at a time, its
even columns to one and its odd to the other. On one AVX2 EPYC core: 96 planes 112x112 ->
56x56 (3x3) 557 -> 330 us; 144 planes 56x56 -> 28x28 (5x5) 313 -> 246 us.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import attrs
import numpy as np
from numba import njit

from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.conv.depthwise import Depthwise, same_padded
from flowrt.workers.cpu.acc.kernels.epilogue import NONE, RELU, activate, activate_planes

if TYPE_CHECKING:
    from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
    from flowrt.workers.cpu.acc.conv.tuning import ConvTuning

# Cells before (and after) a phase plane's rows in its scratch: a tap one column left of the
# first output reads one.
_GUARD = 1


@njit(inline="always", nogil=True, cache=True)
def _fill_phases(phases, x, xo, height, width, oh_count, ow_count):
    """The four phase planes of the input plane at ``x[xo:]`` (``height`` x ``width``) into
    ``phases`` (4, (oh + 2) * ow + 2 guard cells): plane ``2a + b`` holds input cell
    (2R + a, 2C + b) at row R + 1 (R from -1 to oh), column C (0 to ow - 1), zero where that
    cell is off the input."""
    half = width // 2  # odd columns; even ones: width - half, at most ow_count
    zero = np.float32(0)
    for r in range(-1, oh_count + 1):
        line = np.uint64(_GUARD + (r + 1) * ow_count)
        for a in range(2):
            even, odd = phases[2 * a], phases[2 * a + 1]
            y = 2 * r + a
            if 0 <= y < height:
                row = np.uint64(xo + y * width)
                # one pass over the row: even columns to one plane, odd to the other
                for c in range(np.uint64(half)):
                    even[line + c] = x[row + c + c]
                    odd[line + c] = x[row + c + c + np.uint64(1)]
                if width - half > half:
                    even[line + np.uint64(half)] = x[row + np.uint64(width - 1)]
                for c in range(width - half, ow_count):
                    even[line + np.uint64(c)] = zero
                for c in range(half, ow_count):
                    odd[line + np.uint64(c)] = zero
            else:
                for c in range(np.uint64(ow_count)):
                    even[line + c] = zero
                    odd[line + c] = zero


@njit(inline="always", nogil=True, cache=True)
def _column3(even, odd, at, p, w0, w1, w2):
    """A 3x3 kernel column's taps (input rows 2oh - 1, 2oh, 2oh + 1) from the column's phase
    planes of even and odd rows, ``at`` the output's index there, ``p`` the pitch."""
    return (w0 * odd[at - p] + w1 * even[at]) + w2 * odd[at]


@njit(inline="always", nogil=True, cache=True)
def columns3(p00, p01, p10, p11, at, p, wm):
    """The three column sums (:func:`_column3`) of the 3x3 kernel ``wm`` for output index
    ``at`` of the phase planes (``pXY``: rows X, columns Y); the left column's is read one
    before ``at``."""
    one = np.uint64(1)
    return (
        _column3(p01, p11, at - one, p, wm[0, 0], wm[1, 0], wm[2, 0]),
        _column3(p00, p10, at, p, wm[0, 1], wm[1, 1], wm[2, 1]),
        _column3(p01, p11, at, p, wm[0, 2], wm[1, 2], wm[2, 2]),
    )


@njit(inline="always", nogil=True, cache=True)
def _column5(even, odd, at, p, w0, w1, w2, w3, w4):
    """A 5x5 kernel column's taps (input rows 2oh - 2 to 2oh + 2), as :func:`_column3`."""
    return ((w0 * even[at - p] + w1 * odd[at - p]) + (w2 * even[at] + w3 * odd[at])) + w4 * even[at + p]


@njit(inline="always", nogil=True, cache=True)
def _outputs3(o, oo, bias, wm, p00, p01, p10, p11, left, ow_count, pixels, relu):
    """``o[oo + i]`` for the ``pixels`` outputs of a 3x3 plane: bias plus the taps, through
    Relu when ``relu``; ``pXY`` is the phase plane of rows X and columns Y, ``left[i]``
    whether output i's column has one to its left."""
    zero, p = np.float32(0), np.uint64(ow_count)
    start = np.uint64(_GUARD + ow_count)
    for i in range(np.uint64(pixels)):
        c0, c1, c2 = columns3(p00, p01, p10, p11, start + i, p, wm)
        v = ((bias + (c0 if left[i] else zero)) + c1) + c2
        o[oo + i] = activate(v, RELU, zero, zero) if relu else v


@njit(inline="always", nogil=True, cache=True)
def _outputs5(o, oo, bias, wm, p00, p01, p10, p11, left, right, ow_count, pixels, relu):
    """:func:`_outputs3` for a 5x5 kernel; ``right[i]``: whether output i's column has one to
    its right."""
    zero, one, p = np.float32(0), np.uint64(1), np.uint64(ow_count)
    start = np.uint64(_GUARD + ow_count)
    for i in range(np.uint64(pixels)):
        at = start + i
        c0 = _column5(p00, p10, at - one, p, wm[0, 0], wm[1, 0], wm[2, 0], wm[3, 0], wm[4, 0])
        c1 = _column5(p01, p11, at - one, p, wm[0, 1], wm[1, 1], wm[2, 1], wm[3, 1], wm[4, 1])
        c2 = _column5(p00, p10, at, p, wm[0, 2], wm[1, 2], wm[2, 2], wm[3, 2], wm[4, 2])
        c3 = _column5(p01, p11, at, p, wm[0, 3], wm[1, 3], wm[2, 3], wm[3, 3], wm[4, 3])
        c4 = _column5(p00, p10, at + one, p, wm[0, 4], wm[1, 4], wm[2, 4], wm[3, 4], wm[4, 4])
        v = ((bias + ((c0 + c1) if left[i] else zero)) + (c2 + c3)) + (c4 if right[i] else zero)
        o[oo + i] = activate(v, RELU, zero, zero) if relu else v


@njit(inline="always", nogil=True, cache=True)
def _strided2_slice(s, bounds, x, w, bias, out, code, alpha, beta, k):
    """Slice ``s``, planes ``bounds[s] .. bounds[s + 1]``, of the k x k (3 or 5, a constant
    where it is inlined) depthwise conv with stride 2 and k // 2 pad cells on every side of
    C-contiguous ``x`` into C-contiguous ``out``, on scratches of the slice."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    m_count, oh_count, ow_count = out.shape[1], out.shape[2], out.shape[3]
    multiplier = m_count // channels
    pixels = oh_count * ow_count
    x_flat = x.reshape(-1)
    out_flat = out.reshape(-1)
    phases = np.zeros((4, (oh_count + 2) * ow_count + 2 * _GUARD), np.float32)
    p00, p01, p10, p11 = phases[0], phases[1], phases[2], phases[3]
    left = np.ones(pixels, np.bool_)
    right = np.ones(pixels, np.bool_)
    for i in range(pixels):
        left[i] = i % ow_count >= 1
        right[i] = i % ow_count + 1 < ow_count
    relu = code == RELU
    curve = NONE if relu else code  # Relu in the taps' loop, any other curve after
    pending = bounds[s] * pixels
    for task in range(bounds[s], bounds[s + 1]):
        n, m = divmod(task, m_count)
        xo = (n * channels + m // multiplier) * height * width
        _fill_phases(phases, x_flat, xo, height, width, oh_count, ow_count)
        oo = np.uint64(task * pixels)
        if k == 3 and relu:
            _outputs3(out_flat, oo, bias[m], w[m], p00, p01, p10, p11, left, ow_count, pixels, True)
        elif k == 3:
            _outputs3(out_flat, oo, bias[m], w[m], p00, p01, p10, p11, left, ow_count, pixels, False)
        elif relu:
            _outputs5(out_flat, oo, bias[m], w[m], p00, p01, p10, p11, left, right, ow_count, pixels, True)
        else:
            _outputs5(out_flat, oo, bias[m], w[m], p00, p01, p10, p11, left, right, ow_count, pixels, False)
        end = (task + 1) * pixels
        pending = activate_planes(out_flat, pending, end, task == bounds[s + 1] - 1, curve, alpha, beta)


@njit(**NATIVE)
def _strided2_k3(s, _step, bounds, x, w, bias, out, code, alpha, beta):
    """Slice ``s`` of :data:`STRIDED2_K3`: :func:`_strided2_slice` of a 3x3 kernel."""
    _strided2_slice(s, bounds, x, w, bias, out, code, alpha, beta, 3)


@njit(**NATIVE)
def _strided2_k5(s, _step, bounds, x, w, bias, out, code, alpha, beta):
    """Slice ``s`` of :data:`STRIDED2_K5`: :func:`_strided2_slice` of a 5x5 kernel."""
    _strided2_slice(s, bounds, x, w, bias, out, code, alpha, beta, 5)


# One slice function per kernel size, args (bounds, x, w, bias, out, code, alpha, beta): a
# model compiles only the sizes it has (one of them with both took 18 s to compile, most of
# it the code of the other size).
STRIDED2_K3 = SliceFunction(_strided2_k3)
STRIDED2_K5 = SliceFunction(_strided2_k5)


@attrs.frozen(eq=False)
class DepthwiseStrided2(Depthwise):
    """Plan of a 3x3 or 5x5 depthwise conv with stride 2, no dilation and k // 2 pad cells
    on every side: :data:`STRIDED2_K3` or :data:`STRIDED2_K5` (``depthwise.DEPTHWISE`` where
    the output given is not C-contiguous)."""

    name: ClassVar[str] = "depthwise_strided2"

    def plane_slices(self, filters: np.ndarray) -> SliceFunction:
        """:data:`STRIDED2_K3` or :data:`STRIDED2_K5`, by the filters' size."""
        return STRIDED2_K3 if filters.shape[1] == 3 else STRIDED2_K5

    @classmethod
    def applies(cls, geometry: ConvGeometry, tuning: ConvTuning) -> bool:
        """A depthwise conv of that shape."""
        return Depthwise.applies(geometry, tuning) and same_padded(geometry, ((2, 2),))
