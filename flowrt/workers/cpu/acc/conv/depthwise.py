"""Depthwise Conv for CpuAcc (one input channel per group, NCHW): a direct sliding window over
a zero-padded copy of each input channel (split into phase planes when strided), one task per
(image, output channel) plane. Its algorithms, :class:`DepthwiseSame3` and :class:`Depthwise`,
take every depthwise conv (``algorithms.py``).

The planes of depthwise layers are small (7x7 to 112x112), so what a plane costs besides its
taps counts: the copies in and out are plain loops, the pad cells of the scratch are zeroed
once per slice (every plane leaves them untouched), Relu is applied with the last taps and
any other activation in one pass over the output run, and the loops index whole arrays
from unsigned offsets (no slice per plane or row: each costs two reference count updates).
The 3x3 same convs of shufflenet and MobileNet take all nine taps in one loop over the
plane (:data:`DEPTHWISE_SAME3`). One Zen 4 core, batch 4, ns per plane, from three passes
over slices: 14x14 195 -> 77, 7x7 98 -> 32, 28x28 466 -> 265; stride 2 from 56x56 1249 ->
1134, 28x28 600 -> 491, 14x14 343 -> 255.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import attrs
import numpy as np
from numba import njit

from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction, borrowed
from flowrt.workers.cpu.acc.kernels.epilogue import NONE, RELU, activate, activate_in_place, activate_planes
from flowrt.workers.cpu.acc.phases import cell_offset, fill_phase_planes

if TYPE_CHECKING:
    from flowrt.workers.cpu.acc.conv.algorithms import ActArgs
    from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
    from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
    from flowrt.workers.cpu.acc.conv.weights import ConvWeights


@njit(inline="always", nogil=True, cache=True)
def _source_shape(geo, height, width, oh_count, ow_count):
    """Rows and pitch of the padded plane (unit strides) or of each of its ``sh * sw`` phase
    planes (the pixels whose padded row and column are i and j modulo the strides)."""
    kh, kw, sh, sw, dh, dw, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7]
    if sh == 1 and sw == 1:
        return max(ph + height, oh_count + (kh - 1) * dh), max(pw + width, ow_count + (kw - 1) * dw)
    return oh_count + (kh - 1) * dh // sh, ow_count + (kw - 1) * dw // sw


@njit(inline="always", nogil=True, cache=True)
def _tap_start(geo, rows, pitch, ki, kj):
    """Where kernel tap (ki, kj) starts reading the phase planes (the padded plane itself at
    unit strides)."""
    return cell_offset(ki, kj, geo[2], geo[3], geo[4], geo[5], rows * pitch, pitch)


@njit(inline="always", nogil=True, cache=True)
def _row_taps(dst, first, relu, w0, w1, w2, src, s0, s1, s2, n):
    """``dst[i] = first + taps`` (``first`` a float: the bias) or ``dst[i] += taps`` (None;
    through Relu too when ``relu``) for ``i < n``, the taps being one kernel row's
    ``w0 * src[s0 + i] + w1 * src[s1 + i] + w2 * src[s2 + i]``: one loop, which LLVM
    vectorizes. The offsets are unsigned and the arrays whole: a slice costs two reference
    count updates, about as much as a 7x7 plane's taps, and a signed index a wraparound
    test per element."""
    s0, s1, s2 = np.uint64(s0), np.uint64(s1), np.uint64(s2)
    if first is not None:
        for i in range(np.uint64(n)):
            dst[i] = first + (w0 * src[s0 + i] + w1 * src[s1 + i] + w2 * src[s2 + i])
    elif relu:
        zero = np.float32(0)
        for i in range(np.uint64(n)):
            v = dst[i] + (w0 * src[s0 + i] + w1 * src[s1 + i] + w2 * src[s2 + i])
            dst[i] = activate(v, RELU, zero, zero)
    else:
        for i in range(np.uint64(n)):
            dst[i] += w0 * src[s0 + i] + w1 * src[s1 + i] + w2 * src[s2 + i]


@njit(inline="always", nogil=True, cache=True)
def _row_taps5(dst, first, relu, wr, src, s0, s1, s2, s3, s4, n):
    """:func:`_row_taps` for a 5-wide kernel row (MobileNetV3's and EfficientNet's 5x5
    depthwise convs): its five taps ``wr[0..4]`` in one loop, not five passes over ``dst``."""
    w0, w1, w2, w3, w4 = wr[0], wr[1], wr[2], wr[3], wr[4]
    s0, s1, s2, s3, s4 = np.uint64(s0), np.uint64(s1), np.uint64(s2), np.uint64(s3), np.uint64(s4)
    if first is not None:
        for i in range(np.uint64(n)):
            dst[i] = first + (
                (w0 * src[s0 + i] + w1 * src[s1 + i])
                + (w2 * src[s2 + i] + w3 * src[s3 + i])
                + w4 * src[s4 + i]
            )
    elif relu:
        zero = np.float32(0)
        for i in range(np.uint64(n)):
            v = dst[i] + (
                (w0 * src[s0 + i] + w1 * src[s1 + i])
                + (w2 * src[s2 + i] + w3 * src[s3 + i])
                + w4 * src[s4 + i]
            )
            dst[i] = activate(v, RELU, zero, zero)
    else:
        for i in range(np.uint64(n)):
            dst[i] += (
                (w0 * src[s0 + i] + w1 * src[s1 + i])
                + (w2 * src[s2 + i] + w3 * src[s3 + i])
                + w4 * src[s4 + i]
            )


@njit(inline="always", nogil=True, cache=True)
def kernel_row(acc, first, is_first, relu, wm_row, kw, src, base, geo, rows, pitch, ki, total):
    """One kernel row's taps of a depthwise pass into ``acc[:total]``, from the planes at
    ``src[base:]``: onto ``first`` (the bias) when ``is_first``, else added, through Relu when
    ``relu``. 3- and 5-wide rows are one loop each; other widths one loop per tap."""
    if kw == 3:
        s0 = base + _tap_start(geo, rows, pitch, ki, 0)
        s1 = base + _tap_start(geo, rows, pitch, ki, 1)
        s2 = base + _tap_start(geo, rows, pitch, ki, 2)
        if is_first:
            _row_taps(acc, first, False, wm_row[0], wm_row[1], wm_row[2], src, s0, s1, s2, total)
        else:
            _row_taps(acc, None, relu, wm_row[0], wm_row[1], wm_row[2], src, s0, s1, s2, total)
        return
    if kw == 5:
        s0 = base + _tap_start(geo, rows, pitch, ki, 0)
        s1 = base + _tap_start(geo, rows, pitch, ki, 1)
        s2 = base + _tap_start(geo, rows, pitch, ki, 2)
        s3 = base + _tap_start(geo, rows, pitch, ki, 3)
        s4 = base + _tap_start(geo, rows, pitch, ki, 4)
        if is_first:
            _row_taps5(acc, first, False, wm_row, src, s0, s1, s2, s3, s4, total)
        else:
            _row_taps5(acc, None, relu, wm_row, src, s0, s1, s2, s3, s4, total)
        return
    if is_first:
        for i in range(np.uint64(total)):
            acc[i] = first
    for kj in range(kw):
        wv = wm_row[kj]
        start = np.uint64(base + _tap_start(geo, rows, pitch, ki, kj))
        for i in range(np.uint64(total)):
            acc[i] += wv * src[start + i]
    if relu:
        zero = np.float32(0)
        for i in range(np.uint64(total)):
            acc[i] = activate(acc[i], RELU, zero, zero)


@njit(inline="always", nogil=True, cache=True)
def _depthwise_plane(src, x, wm, b, out, n, m, acc, geo, rows, pitch, code, alpha, beta):
    """Output plane ``out[n, m]`` of a depthwise conv from its input plane ``x``.

    Every tap is one long unit-stride loop over the flattened padded plane (or one of its
    phase planes) from a fixed offset, and a 3-wide kernel row's taps share one loop: the
    output is computed on that plane's row pitch (a few columns per row too many, then
    dropped), which LLVM vectorizes. ``src`` is the scratch of the padded or phase planes,
    ``acc`` of the output run."""
    kh, kw, sh, sw, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[6], geo[7]
    oh_count, ow_count = out.shape[2], out.shape[3]
    fill_phase_planes(src, x, rows, pitch, rows * pitch, sh, sw, ph, pw)
    total = (oh_count - 1) * pitch + ow_count
    relu = code == RELU
    # a kernel row's taps in one loop (kernel_row), the bias with the first, Relu with the last
    for ki in range(kh):
        kernel_row(
            acc, b, ki == 0, relu and ki == kh - 1 and kh > 1, wm[ki], kw, src, 0, geo, rows, pitch, ki, total
        )
    if kh == 1 or not relu:
        activate_in_place(acc[:total], code, alpha, beta)
    store_plane(acc, out, n, m, pitch)


@njit(inline="always", nogil=True, cache=True)
def store_plane(acc, out, n, m, pitch):
    """Output plane ``out[n, m]`` from the run ``acc`` computed on a row pitch of ``pitch``
    (the last ``pitch - width`` cells of each row dropped)."""
    n, m = np.uint64(n), np.uint64(m)
    for oh in range(np.uint64(out.shape[2])):
        line = oh * np.uint64(pitch)
        for ow in range(np.uint64(out.shape[3])):
            out[n, m, oh, ow] = acc[line + ow]


@njit(**NATIVE)
def _depthwise_slice(s, _step, bounds, x, w, bias, out, geo, code, alpha, beta):
    """Slice ``s`` of :data:`DEPTHWISE` (a :class:`SliceFunction`): the (image, output
    channel) planes ``bounds[s] .. bounds[s + 1]`` by a direct sliding window over a
    zero-padded copy of the input channel (output channel m reads input channel
    m // multiplier)."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    m_count, oh_count, ow_count = out.shape[1], out.shape[2], out.shape[3]
    multiplier = m_count // channels
    rows, pitch = _source_shape(geo, height, width, oh_count, ow_count)
    # scratch of the slice: the padded or phase planes (pad cells stay zero) and the output run
    src = np.zeros(geo[2] * geo[3] * rows * pitch, np.float32)
    acc = np.empty(oh_count * pitch, np.float32)
    for task in range(bounds[s], bounds[s + 1]):
        n, m = divmod(task, m_count)
        _depthwise_plane(
            borrowed(src), borrowed(x[n, m // multiplier]), borrowed(w[m]), bias[m], borrowed(out), n, m,
            borrowed(acc), geo, rows, pitch, code, alpha, beta,
        )  # fmt: skip


# Any depthwise conv: args (bounds, x, w, bias, out, geo, code, alpha, beta).
DEPTHWISE = SliceFunction(_depthwise_slice)


@njit(inline="always", nogil=True, cache=True)
def bordered_plane_masks(height, width):
    """(first, last): which outputs of a plane ``width`` wide may add their left and right
    taps (those not in the first, and not in the last, column), for :func:`nine_taps`."""
    pixels = height * width
    first = np.ones(pixels, np.bool_)
    last = np.ones(pixels, np.bool_)
    for r in range(height):
        first[r * width] = False
        last[r * width + width - 1] = False
    return first, last


@njit(inline="always", nogil=True, cache=True)
def nine_taps(o, oo, b, wm, middle, first, last, width, pixels, relu):
    """``o[oo + i]`` for ``i < pixels``: bias ``b`` plus the nine taps of ``wm`` read from the
    bordered plane ``middle`` (the plane at ``width + 1``, zeros around it), through Relu
    when ``relu``. A tap left of column 0 reads the row above's last cell and one right of
    the last column the row below's first: ``first`` and ``last`` (per output, nonzero but
    in the first and last column) drop those. One loop, unsigned indices: LLVM vectorizes it
    and each cell of the plane is read from L1 nine times."""
    at, w = np.uint64(width + 1), np.uint64(width)
    up, down, one = at - w, at + w, np.uint64(1)
    w00, w01, w02 = wm[0, 0], wm[0, 1], wm[0, 2]
    w10, w11, w12 = wm[1, 0], wm[1, 1], wm[1, 2]
    w20, w21, w22 = wm[2, 0], wm[2, 1], wm[2, 2]
    zero = np.float32(0)
    for i in range(np.uint64(pixels)):
        left = (w00 * middle[up + i - one] + w10 * middle[at + i - one]) + w20 * middle[down + i - one]
        centre = (w01 * middle[up + i] + w11 * middle[at + i]) + w21 * middle[down + i]
        right = (w02 * middle[up + i + one] + w12 * middle[at + i + one]) + w22 * middle[down + i + one]
        v = ((b + (left if first[i] else zero)) + centre) + (right if last[i] else zero)
        o[oo + i] = activate(v, RELU, zero, zero) if relu else v


@njit(inline="always", nogil=True, cache=True)
def _same3_plane(x, xo, wm, b, o, oo, width, pixels, middle, first, last, code):
    """One output plane, ``o[oo : oo + pixels]``, of a 3x3 depthwise conv with unit strides
    and one pad cell on every side, from the input plane ``x[xo : xo + pixels]`` (flat
    arrays): the plane is copied into the middle of a scratch whose zeros around it stand
    for the pad rows, and the nine taps are one loop over the whole plane (no per-row or
    border cases). A fused Relu is applied in that loop; another curve by the slice, over
    several planes at once (``activate_planes``)."""
    xo, to = np.uint64(xo), np.uint64(width + 1)
    for t in range(np.uint64(pixels)):
        middle[to + t] = x[xo + t]
    if code == RELU:
        nine_taps(o, np.uint64(oo), b, wm, middle, first, last, width, pixels, True)
    else:
        nine_taps(o, np.uint64(oo), b, wm, middle, first, last, width, pixels, False)


@njit(**NATIVE)
def _same3_slice(s, _step, bounds, x, w, bias, out, code, alpha, beta):
    """Slice ``s`` of :data:`DEPTHWISE_SAME3`: :func:`_depthwise_slice` for a 3x3 kernel, unit
    strides and dilations and one pad cell on each side (the output planes have the input's
    shape), on C-contiguous ``x`` and ``out``: each plane by :func:`_same3_plane`, on
    scratches of the slice. 32-36% faster than three loops (one per kernel row) over three
    copies of the plane with a column zeroed in two: on one Zen 4 core, 28x28 planes 399 ->
    275 ns each, 14x14 114 -> 78, 7x7 49 -> 31."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    m_count = out.shape[1]
    multiplier = m_count // channels
    pixels = height * width
    x_flat = x.reshape(-1)
    out_flat = out.reshape(-1)
    # zero borders of width + 1 cells on both sides, which the planes leave untouched
    middle = np.zeros(pixels + 2 * (width + 1), np.float32)
    first, last = bordered_plane_masks(height, width)
    pending = bounds[s] * pixels
    curve = NONE if code == RELU else code  # Relu in the taps' loop, any other curve after
    for task in range(bounds[s], bounds[s + 1]):
        n, m = divmod(task, m_count)
        xo = (n * channels + m // multiplier) * pixels
        _same3_plane(
            x_flat, xo, w[m], bias[m], out_flat, task * pixels, width, pixels, middle, first, last, code
        )
        end = (task + 1) * pixels
        pending = activate_planes(out_flat, pending, end, task == bounds[s + 1] - 1, curve, alpha, beta)


# args (bounds, x, w, bias, out, code, alpha, beta), as every ``plane_kernel``.
DEPTHWISE_SAME3 = SliceFunction(_same3_slice)


def same_padded(geometry: ConvGeometry, strides: tuple[tuple[int, int], ...]) -> bool:
    """A 3x3 or 5x5 kernel at one of ``strides``, no dilation, k // 2 pad cells on every side
    (the depthwise convs of the mobile nets)."""
    g = geometry.window
    k = geometry.kernel[0]
    return (
        geometry.kernel in ((3, 3), (5, 5))
        and g.strides in strides
        and g.dilations == (1, 1)
        and g.pads_begin == g.pads_end == (k // 2, k // 2)
    )


@attrs.frozen(eq=False)
class Depthwise:
    """Plan of a depthwise conv (groups == input channels > 1): :data:`DEPTHWISE` over
    (image, output channel) planes, ``plane_bounds`` of them per slice."""

    name: ClassVar[str] = "depthwise"
    # A subclass's slice function for its shapes, args ``(plane_bounds, x, filters, bias,
    # out, code, alpha, beta)``, on a C-contiguous output (see :meth:`plane_slices`).
    plane_kernel: ClassVar[SliceFunction | None] = None
    geo: np.ndarray
    plane_bounds: np.ndarray

    @classmethod
    def applies(cls, geometry: ConvGeometry, tuning: ConvTuning) -> bool:
        """One input channel per group, more than one group."""
        return geometry.groups == geometry.x_shape[1] > 1

    @classmethod
    def plan(cls, geometry: ConvGeometry, tuning: ConvTuning) -> Depthwise:
        """The planes split over the workers."""
        planes = geometry.x_shape[0] * geometry.w_shape[0]
        return cls(geometry.geo(), split_bounds(planes, SplitHint(0, 1), geometry.workers))

    def run(
        self, weights: ConvWeights, x, w, w_shape, bias, out, finish: bool, constant: bool, act: ActArgs
    ) -> None:
        """See ``algorithms.ConvAlgorithm.run``: by the subclass's ``plane_kernel`` where the
        output is C-contiguous, else by :func:`depthwise`."""
        filters = w.reshape(w_shape[0], *w_shape[2:])
        bounds = self.plane_bounds
        kernel = self.plane_slices(filters)
        if kernel is not None and out.flags.c_contiguous:
            kernel.run(bounds.shape[0] - 1, (bounds, x, filters, bias, out, *act))
        else:
            DEPTHWISE.run(bounds.shape[0] - 1, (bounds, x, filters, bias, out, self.geo, *act))

    def plane_slices(self, filters: np.ndarray) -> SliceFunction | None:
        """The slice function for these filters ((out channels, kh, kw)): ``plane_kernel``."""
        return self.plane_kernel


@attrs.frozen(eq=False)
class DepthwiseSame3(Depthwise):
    """Plan of a 3x3 depthwise conv with unit strides and dilations, one pad cell on every side
    and planes of at least 2x2: :data:`DEPTHWISE_SAME3` (:data:`DEPTHWISE` where the output
    given is not C-contiguous)."""

    name: ClassVar[str] = "depthwise_same3"
    plane_kernel = DEPTHWISE_SAME3

    @classmethod
    def applies(cls, geometry: ConvGeometry, tuning: ConvTuning) -> bool:
        """A depthwise conv of that shape."""
        g = geometry.window
        return (
            Depthwise.applies(geometry, tuning)
            and geometry.kernel == (3, 3)
            and g.strides == g.dilations == (1, 1)
            and g.pads_begin == g.pads_end == (1, 1)
            and min(geometry.x_shape[2:]) >= 2
        )
