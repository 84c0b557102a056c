"""Depthwise QLinearConv (one filter per channel, MobileNet's 3x3 layers) on uint8 input and
int8 weights: per channel, int32 sums of ``(x - x_zp) * (w - w_zp)`` over the window cells
inside the input (a cell in the padding adds ``(x_zp - x_zp) * w = 0``), requantized as the
GEMM's epilogue does: ``clip(rint(float32(acc + bias) * scale) + y_zp, 0, 255)``.

One output row at a time: per kernel cell, a loop over the row's output pixels, adding the
input row's values (at the stride) times the cell's weight into an int32 row. The channels
split across the workers. Output planes of ``CHANNELS_LAST_PLANE`` values or fewer (the
deep layers' 7x7) take the input channels last instead, and add each kernel
cell's products over all the channels of a pixel at once; their rows split. The 3x3 windows
of one pad cell that keep the plane's size (MobileNet's stride-1 layers) run the float
depthwise kernel's nine-tap loop on the plane less its zero point (:data:`SAME3`), exact in
float32, and those of stride 2 that halve an even plane a nine-tap loop over its four
phase planes (:data:`HALF3`), at any plane size: in mobilenet_v2 on two Zen 5 cores,
14x14x576 138 -> 27 us, 112x112x96 of stride 2 116 -> 84, 56x56x144 of stride 2 88 -> 36,
7x7x960 (channels last before) 60 -> 23.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.conv.depthwise import bordered_plane_masks, nine_taps
from flowrt.workers.cpu.acc.conv.int8_layout import split_phases
from flowrt.workers.cpu.acc.quantized_parameters import ParameterCache, per_row, requantization_scales


@njit(nogil=True, cache=True, inline="always")
def _requantize(acc, scale, y_zero, out):
    """``out = clip(rint(float32(acc) * scale) + y_zero, 0, 255)`` as uint8."""
    for t in range(acc.shape[0]):
        value = np.rint(np.float32(acc[t]) * scale) + y_zero
        out[t] = np.uint8(min(max(value, np.float32(0)), np.float32(255)))


@njit(nogil=True, cache=True, inline="always")
def _requantize_sums(sums, bias, scale, y_zero, exact, out):
    """``out = clip(rint(float32(int32(sums) + bias) * scale) + y_zero, 0, 255)`` as uint8:
    :func:`_requantize` of a plane summed exactly in float32 (``sums``). ``exact``: the bias
    is small enough (:data:`EXACT_BIAS`) that float32 adds it to any sum exactly, the same
    value without the two conversions (half the time)."""
    low, high = np.float32(0), np.float32(255)
    if exact:
        float_bias = np.float32(bias)
        for t in range(sums.shape[0]):
            value = np.rint((sums[t] + float_bias) * scale) + y_zero
            out[t] = np.uint8(np.int32(min(max(value, low), high)))
        return
    for t in range(sums.shape[0]):
        value = np.rint(np.float32(np.int32(sums[t]) + bias) * scale) + y_zero
        out[t] = np.uint8(min(max(value, low), high))


@njit(nogil=True, cache=True, inline="always")
def _shifted_add(flat, plane, dy, dx, width, weight, x_zero):
    """``plane[oy, ox] += (flat[oy + dy, ox + dx] - x_zero) * weight`` where that is inside
    ``flat`` (both planes ``width`` wide, as flat arrays): one long loop over the plane (the
    input shifted), then what the shift carried across a side edge taken back out."""
    size = plane.shape[0]
    height = size // width
    top, bottom = max(0, -dy), min(height, flat.shape[0] // width - dy)  # rows whose input row is inside
    if bottom <= top:
        return
    offset = dy * width + dx
    low = max(top * width, -offset)
    high = min(bottom * width, flat.shape[0] - offset)
    if high > low:
        sums, values = plane[low:high], flat[low + offset : high + offset]
        for t in range(high - low):  # range indices, unit stride: vectorizes
            sums[t] += (np.int32(values[t]) - x_zero) * weight
    if dx == 0:
        return
    first, last = (0, min(width, -dx)) if dx < 0 else (max(0, width - dx), width)
    for oy in range(top, bottom):
        for ox in range(first, last):
            n = oy * width + ox
            if low <= n < high:
                plane[n] -= (np.int32(flat[n + offset]) - x_zero) * weight


@njit(nogil=True, cache=True, inline="always")
def _same_plane(flat, weights, bias, geometry, width, x_zero, plane):
    """One channel of a stride-1 window whose output is the input's size: per kernel cell,
    the input shifted by the cell added over the whole plane (:func:`_shifted_add`)."""
    kernel_h, kernel_w, _, _, dilation_h, dilation_w, pad_top, pad_left = geometry
    plane[:] = bias
    for i in range(kernel_h):
        for j in range(kernel_w):
            dy, dx = i * dilation_h - pad_top, j * dilation_w - pad_left
            _shifted_add(flat, plane, dy, dx, width, weights[i, j], x_zero)


@njit(nogil=True, cache=True, inline="always")
def _half_plane(image, weights, bias, geometry, x_zero, phases, plane):
    """One channel of a stride-2 window whose output is half the input's (even) size: the
    input split once into its four phase planes (even or odd rows by even or odd columns),
    in which each kernel cell is a stride-1 shift (:func:`_shifted_add`)."""
    kernel_h, kernel_w, _, _, dilation_h, dilation_w, pad_top, pad_left = geometry
    half_w = image.shape[1] // 2
    split_phases(image, phases)
    plane[:] = bias
    for i in range(kernel_h):
        for j in range(kernel_w):
            dy, dx = i * dilation_h - pad_top, j * dilation_w - pad_left
            py, px = dy % 2, dx % 2
            flat = phases[py * 2 + px]
            _shifted_add(flat, plane, (dy - py) // 2, (dx - px) // 2, half_w, weights[i, j], x_zero)


@njit(**NATIVE)
def _depthwise_slice(s, _step, bounds, x, weights, bias, scale, geometry, x_zero, y_zero, out):
    """Slice ``s`` of :data:`DEPTHWISE`: channels ``bounds[s] .. bounds[s + 1]`` of ``out``
    (C, OH, OW) uint8 from ``x`` (C, H, W) uint8; ``weights`` (C, KH, KW) int32 with the
    weights' zero points subtracted, ``bias`` int32 and ``scale`` float32 (C,);
    ``geometry``: kernel, stride, dilation and leading pad, height then width."""
    kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w, pad_top, pad_left = geometry
    height, width = x.shape[1], x.shape[2]
    out_h, out_w = out.shape[1], out.shape[2]
    acc = np.empty(out_w, np.int32)
    same = stride_h == 1 and stride_w == 1 and out_h == height and out_w == width
    halved = (
        stride_h == 2 and stride_w == 2 and height % 2 == 0 and width % 2 == 0
        and out_h == height // 2 and out_w == width // 2
    )  # fmt: skip
    plane = np.empty(out_h * out_w if same or halved else 0, np.int32)
    phases = np.empty((4 if halved else 0, out_h * out_w), np.uint8)
    for c in range(bounds[s], bounds[s + 1]):
        if same:
            _same_plane(x[c].reshape(-1), weights[c], bias[c], geometry, width, x_zero, plane)
        elif halved:
            _half_plane(x[c], weights[c], bias[c], geometry, x_zero, phases, plane)
        if same or halved:
            _requantize(plane, scale[c], y_zero, out[c].reshape(-1))
            continue
        for oy in range(out_h):
            acc[:] = bias[c]
            for i in range(kernel_h):
                y = oy * stride_h - pad_top + i * dilation_h
                if y < 0 or y >= height:
                    continue
                source = x[c, y]
                for j in range(kernel_w):
                    shift = j * dilation_w - pad_left  # input column of ox: ox * stride + shift
                    first = min(out_w, max(0, -(shift // stride_w)))
                    last = (
                        min(out_w, max(first, (width - 1 - shift) // stride_w + 1))
                        if width > shift
                        else first
                    )
                    weight = weights[c, i, j]
                    sums, values = acc[first:last], source[first * stride_w + shift :]
                    if stride_w == 1:  # a loop that vectorizes (range indices, unit stride)
                        for t in range(last - first):
                            sums[t] += (np.int32(values[t]) - x_zero) * weight
                        continue
                    for t in range(last - first):
                        sums[t] += (np.int32(values[t * stride_w]) - x_zero) * weight
            row, channel_scale = out[c, oy], scale[c]
            for t in range(out_w):
                value = np.rint(np.float32(acc[t]) * channel_scale) + y_zero
                row[t] = np.uint8(min(max(value, np.float32(0)), np.float32(255)))


DEPTHWISE = SliceFunction(_depthwise_slice)


@njit(**NATIVE)
def _same3_slice(s, _step, bounds, x, weights, bias, scale, x_zero, y_zero, exact, out):
    """Slice ``s`` of :data:`SAME3`: channels ``bounds[s] .. bounds[s + 1]`` of a 3x3 window of
    unit strides and dilations and one pad cell on each side, ``out`` (C, H, W) uint8 from
    ``x`` (C, H, W) uint8; ``weights`` (C, 3, 3) float32 less their zero points. Each plane,
    less the input's zero point, is copied into the middle of a float32 scratch whose zeros
    stand for the padding (whose values, ``x_zero``, add nothing), and the nine taps are the
    float depthwise kernel's one loop over the plane (``depthwise.nine_taps``): every product
    and partial sum is an integer below 2**24 (9 * 255 * 255), so float32 sums them exactly,
    then requantized as :func:`_requantize`."""
    height, width = x.shape[1], x.shape[2]
    pixels = height * width
    x_flat = x.reshape(-1)
    middle = np.zeros(pixels + 2 * (width + 1), np.float32)
    sums = np.empty(pixels, np.float32)
    first, last = bordered_plane_masks(height, width)
    zero = np.float32(x_zero)
    to = np.uint64(width + 1)
    for c in range(bounds[s], bounds[s + 1]):
        at = np.uint64(c * pixels)
        for t in range(np.uint64(pixels)):
            middle[to + t] = np.float32(x_flat[at + t]) - zero
        nine_taps(sums, np.uint64(0), np.float32(0), weights[c], middle, first, last, width, pixels, False)
        _requantize_sums(sums, bias[c], scale[c], y_zero, exact, out[c].reshape(-1))


SAME3 = SliceFunction(_same3_slice)


@njit(nogil=True, cache=True, inline="always")
def _half3_taps(sums, wm, p00, p01, p10, p11, first, at, hw, pixels):
    """``sums[i]``: the nine taps of ``wm`` at output ``i`` of a 3x3 window of stride 2 with
    one pad cell on the top and left, from the input's phase planes ``p{row}{column}`` (row
    and column parity), each at ``at`` after a zero row (the top padding) and ``hw`` wide:
    the window's cells of row 0 read the odd rows' planes a row up, those of column 0 the odd
    columns' planes a column left (``first[i]``: not in the first column)."""
    w00, w01, w02 = wm[0, 0], wm[0, 1], wm[0, 2]
    w10, w11, w12 = wm[1, 0], wm[1, 1], wm[1, 2]
    w20, w21, w22 = wm[2, 0], wm[2, 1], wm[2, 2]
    zero, one, up = np.float32(0), np.uint64(1), at - np.uint64(hw)
    for i in range(np.uint64(pixels)):
        left = (w00 * p11[up + i - one] + w10 * p01[at + i - one]) + w20 * p11[at + i - one]
        rest = (w01 * p10[up + i] + w02 * p11[up + i]) + (w11 * p00[at + i] + w12 * p01[at + i])
        sums[i] = ((left if first[i] else zero) + rest) + (w21 * p10[at + i] + w22 * p11[at + i])


@njit(**NATIVE)
def _half3_slice(s, _step, bounds, x, weights, bias, scale, x_zero, y_zero, exact, out):
    """Slice ``s`` of :data:`HALF3`: :func:`_same3_slice` for a 3x3 window of stride 2 (unit
    dilations, one pad cell on each side) that halves an even plane: each input plane, less
    its zero point, split into its four phase planes in float32 scratches (:func:`_half3_taps`
    reads them), the sums exact as in :func:`_same3_slice`."""
    height, width = x.shape[1], x.shape[2]
    hh, hw = height // 2, width // 2
    pixels = hh * hw
    at = np.uint64(hw + 1)
    phases = np.zeros((4, pixels + hw + 1), np.float32)  # the zero row before each stays zero
    p00, p01, p10, p11 = phases[0], phases[1], phases[2], phases[3]
    sums = np.empty(pixels, np.float32)
    first = np.ones(pixels, np.bool_)
    for r in range(hh):
        first[r * hw] = False
    zero = np.float32(x_zero)
    for c in range(bounds[s], bounds[s + 1]):
        plane = x[c]
        for y in range(hh):
            even, odd = plane[2 * y], plane[2 * y + 1]
            row = at + np.uint64(y * hw)
            for k in range(np.uint64(hw)):
                p00[row + k] = np.float32(even[2 * k]) - zero
                p01[row + k] = np.float32(even[2 * k + 1]) - zero
                p10[row + k] = np.float32(odd[2 * k]) - zero
                p11[row + k] = np.float32(odd[2 * k + 1]) - zero
        _half3_taps(sums, weights[c], p00, p01, p10, p11, first, at, hw, pixels)
        _requantize_sums(sums, bias[c], scale[c], y_zero, exact, out[c].reshape(-1))


HALF3 = SliceFunction(_half3_slice)


@njit(**NATIVE)
def _to_channels_last_slice(s, _step, bounds, x, x_zero, xt):
    """Slice ``s`` of :data:`TO_CHANNELS_LAST`: rows ``bounds[s] .. bounds[s + 1]`` of ``xt``
    (H, W, C) float32, ``x`` (C, H, W) uint8 less its zero point (an integer, exact)."""
    channels, width = x.shape[0], x.shape[2]
    for y in range(bounds[s], bounds[s + 1]):
        for k in range(width):
            for c in range(channels):  # the writes in order
                xt[y, k, c] = np.float32(np.int32(x[c, y, k]) - x_zero)


@njit(**NATIVE)
def _channels_last_slice(s, _step, bounds, xt, weights, bias, scale, geometry, y_zero, out):
    """Slice ``s`` of :data:`CHANNELS_LAST`: output rows ``bounds[s] .. bounds[s + 1]`` of
    ``out`` (C, OH, OW) uint8 from ``xt`` (H, W, C) float32 (the input less its zero point);
    ``weights`` (KH, KW, C) float32 less their zero points. Per output pixel, each kernel cell
    inside the input adds a product over every channel: loops along the channels, which
    vectorize, for planes too small for the plane-wise loops to pay. The products and their
    sum are integers below 2**24 (``MAX_TAPS`` cells of 255 * 255 at most): float32 holds
    them exactly, and its lanes are twice int64's, the type numba gives integer products."""
    kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w, pad_top, pad_left = geometry
    height, width, channels = xt.shape[0], xt.shape[1], xt.shape[2]
    out_w = out.shape[2]
    acc = np.empty(channels, np.float32)
    for oy in range(bounds[s], bounds[s + 1]):
        for ox in range(out_w):
            acc[:] = 0
            for i in range(kernel_h):
                y = oy * stride_h - pad_top + i * dilation_h
                if y < 0 or y >= height:
                    continue
                for j in range(kernel_w):
                    k = ox * stride_w - pad_left + j * dilation_w
                    if k < 0 or k >= width:
                        continue
                    for c in range(channels):  # indexed, no views: a view costs a reference count
                        acc[c] += xt[y, k, c] * weights[i, j, c]
            for c in range(channels):
                total = np.int32(acc[c]) + bias[c]
                value = np.rint(np.float32(total) * scale[c]) + y_zero
                out[c, oy, ox] = np.uint8(min(max(value, np.float32(0)), np.float32(255)))


TO_CHANNELS_LAST = SliceFunction(_to_channels_last_slice)
CHANNELS_LAST = SliceFunction(_channels_last_slice)
# Output planes of at most this many values take the channels-last loops (mobilenet_v2's 7x7
# layers, 960 channels: 0.36 ms plane-wise, where each channel's set-up outweighed its work,
# 0.14 ms channels last; at 14x14 the two were even, at 28x28 plane-wise won), but for the
# 3x3 windows of SAME3 and HALF3, which run those at a third of the channels-last time.
CHANNELS_LAST_PLANE = 64
# Kernel cells a channels-last layer sums in float32 exactly: 258 * 255 * 255 < 2**24.
MAX_TAPS = 258
# The largest bias (in magnitude) that float32 adds exactly to any sum of nine products of
# SAME3 and HALF3 (each at most 255 * 255): the sum stays below 2**24.
EXACT_BIAS = 2**24 - 9 * 255 * 255

# Output values below which a layer runs on the calling thread alone (see qlinear.PARALLEL_WORK).
PARALLEL_OUTPUTS = 1 << 14


def is_depthwise(group: int, x_channels, w_shape) -> bool:
    """Whether a conv of ``group`` groups is depthwise with one filter per channel."""
    return group > 1 and group == x_channels and w_shape[0] == group and w_shape[1] == 1


class DepthwiseInt8:
    """A depthwise QLinearConv's constant weights, and what it makes of its scales and zero
    points (a ParameterCache)."""

    def __init__(self, weights: np.ndarray, bias: np.ndarray | None, workers: int, constant: bool) -> None:
        self.raw = weights.reshape(weights.shape[0], weights.shape[2], weights.shape[3]).astype(np.int32)
        self.bias = np.zeros(self.raw.shape[0], np.int32) if bias is None else bias.astype(np.int32)
        self.exact = bool(np.abs(self.bias.astype(np.int64)).max(initial=0) <= EXACT_BIAS)
        self.workers = workers
        self.parameters = ParameterCache(self._make, constant)

    def _make(self, x_scale, x_zero, w_scale, w_zero, y_scale, y_zero):
        """The weights less their zero points (as (C, KH, KW) and channels last), the
        scales, and the two zero points."""
        channels = self.raw.shape[0]
        w_zp = per_row(w_zero, channels, np.int32)
        weights = np.ascontiguousarray(self.raw - w_zp.reshape(-1, 1, 1))
        return (
            weights,
            requantization_scales(x_scale, w_scale, y_scale, channels),
            np.int32(np.asarray(x_zero).reshape(())),
            np.float32(np.asarray(y_zero).reshape(())),
            np.ascontiguousarray(weights.transpose(1, 2, 0), dtype=np.float32),
            weights.astype(np.float32),
        )

    def run(self, x: np.ndarray, params: tuple, layout: tuple, out: np.ndarray) -> None:
        """``out`` (N, C, OH, OW) from ``x`` (N, C, H, W); ``params`` the layer's scales and zero
        points (inputs 1, 2, 4, 5, 6, 7), ``layout`` as :func:`_depthwise_slice` takes it."""
        weights, scale, x_zero, y_zero, channels_last, float_weights = self.parameters(*params)
        channels = x.shape[1]
        taps = weights.shape[1] * weights.shape[2]
        height, width = x.shape[2:]
        same3 = (
            layout == (3, 3, 1, 1, 1, 1, 1, 1) and out.shape[2:] == x.shape[2:] and min(height, width) >= 2
        )
        half3 = (
            layout == (3, 3, 2, 2, 1, 1, 1, 1)
            and height % 2 == 0
            and width % 2 == 0
            and out.shape[2:] == (height // 2, width // 2)
        )
        small = out.shape[2] * out.shape[3] <= CHANNELS_LAST_PLANE
        if small and not (same3 or half3) and taps <= MAX_TAPS:
            self._channels_last(x, channels_last, scale, layout, x_zero, y_zero, out)
            return
        slices = 1 if out[0].size < PARALLEL_OUTPUTS else min(self.workers, channels)
        bounds = np.array([channels * i // slices for i in range(slices + 1)], np.int64)
        for b in range(x.shape[0]):
            image = np.ascontiguousarray(x[b])
            if (same3 or half3) and out[b].flags.c_contiguous:
                nine = (bounds, image, float_weights, self.bias, scale, x_zero, y_zero, self.exact, out[b])
                (SAME3 if same3 else HALF3).run(slices, nine)
                continue
            args = (bounds, image, weights, self.bias, scale, layout, x_zero, y_zero, out[b])
            DEPTHWISE.run(slices, args)

    def _channels_last(self, x, weights, scale, layout, x_zero, y_zero, out) -> None:
        """Small planes: the input laid out channels last, then every channel of a pixel at once."""
        _, _, height, width = x.shape
        out_h = out.shape[2]
        xt = np.empty((height, width, x.shape[1]), np.float32)
        parts = 1 if out[0].size < PARALLEL_OUTPUTS else self.workers
        rows_in = np.array(
            [height * i // min(parts, height) for i in range(min(parts, height) + 1)], np.int64
        )
        rows_out = np.array([out_h * i // min(parts, out_h) for i in range(min(parts, out_h) + 1)], np.int64)
        for b in range(x.shape[0]):
            image = np.ascontiguousarray(x[b])
            TO_CHANNELS_LAST.run(rows_in.shape[0] - 1, (rows_in, image, x_zero, xt))
            args = (rows_out, xt, weights, self.bias, scale, layout, y_zero, out[b])
            CHANNELS_LAST.run(rows_out.shape[0] - 1, args)
