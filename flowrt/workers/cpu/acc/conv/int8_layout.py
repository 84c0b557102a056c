"""The layouts a QLinearConv's uint8 input takes for the int8 GEMM (``kernels/qlinear.py``):
its column matrix (im2col, the padding filled with the input's zero point; a stride-2 window
over an even plane from the input's four phase planes), or the input padded with its zero
point, whose windows are the rows of the product (``int8_windows.qgemm_windows``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.kernels.pool_vectors import BYTE_LANES, copy_row


@njit(nogil=True, cache=True, inline="always")
def _copy(target, at, source, start, count):
    """``target[at : at + count] = source[start : start + count]`` as a loop LLVM vectorizes
    (numba's slice assignment copies byte by byte: 30x slower)."""
    into, out_of = target[at : at + count], source[start : start + count]
    for k in range(count):  # indices a range gives: no check for negative ones, so it vectorizes
        into[k] = out_of[k]


@njit(nogil=True, cache=True, inline="always")
def _shifted_rows(flat, row, dy, dx, width, height, fill):
    """One im2col row of a stride-1 window whose output is as wide as the input: the input
    (flat) shifted by ``dy`` rows and ``dx`` columns, one long copy, then ``fill`` where that
    crossed the top, bottom, left or right edge."""
    out_h = row.shape[0] // width
    first = min(out_h, max(0, -dy))  # output rows whose input row is inside
    last = max(first, min(out_h, height - dy))
    row[: first * width] = fill
    row[last * width :] = fill
    if last > first:
        start = (first + dy) * width + dx
        begin, end = first * width, last * width
        low, high = max(begin, -start + begin), min(end, flat.shape[0] - start + begin)
        row[begin:low] = fill
        row[high:end] = fill
        _copy(row, low, flat, start + low - begin, high - low)
        for oy in range(first, last):  # the columns shifted across the left or right edge
            base = oy * width
            if dx < 0:
                row[base : base + min(width, -dx)] = fill
            elif dx > 0:
                row[base + max(0, width - dx) : base + width] = fill


@njit(nogil=True, cache=True, inline="always")
def split_phases(image, phases):
    """The four phase planes of ``image`` (H, W), both even: ``phases[py * 2 + px]`` holds its
    rows ``py::2`` by columns ``px::2``, (H/2, W/2) flat. In them a stride-2 window's kernel
    cell is a stride-1 shift, one long copy of an im2col row (:func:`_shifted_rows`)."""
    half_h, half_w = image.shape[0] // 2, image.shape[1] // 2
    for y in range(half_h):
        for py in range(2):
            source = image[2 * y + py]
            even, odd = phases[py * 2], phases[py * 2 + 1]
            for k in range(half_w):
                even[y * half_w + k] = source[2 * k]
                odd[y * half_w + k] = source[2 * k + 1]


@njit(**NATIVE)
def _im2col_slice(s, _step, bounds, x, geometry, out_w, fill, cols):
    """Slice ``s`` of :data:`IM2COL`: for the (channel, kernel row) pairs ``bounds[s] ..
    bounds[s + 1]``, ``cols[(c, i, j), (oy, ox)] = x[c, oy * stride - pad + i * dilation, ...]``,
    ``fill`` where that falls outside ``x`` (C, H, W). ``geometry``: kernel, stride, dilation
    and leading pad, height then width. A row's inside part is one strided copy, its edges fills."""
    kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w, pad_top, pad_left = geometry
    height, width = x.shape[1], x.shape[2]
    out_h = cols.shape[1] // out_w
    halved = (
        stride_h == 2 and stride_w == 2 and height % 2 == 0 and width % 2 == 0
        and out_h == height // 2 and out_w == width // 2
    )  # fmt: skip
    phases = np.empty((4, out_h * out_w) if halved else (0, 0), np.uint8)
    phased = -1  # the channel whose phase planes ``phases`` holds
    for pair in range(bounds[s], bounds[s + 1]):
        c, i = pair // kernel_h, pair % kernel_h
        if halved:
            if phased != c:
                split_phases(x[c], phases)
                phased = c
            dy = i * dilation_h - pad_top
            py = dy % 2
            for j in range(kernel_w):
                dx = j * dilation_w - pad_left
                px = dx % 2
                row = cols[(c * kernel_h + i) * kernel_w + j]
                _shifted_rows(phases[py * 2 + px], row, (dy - py) // 2, (dx - px) // 2, out_w, out_h, fill)
            continue
        for j in range(kernel_w):
            shift = j * dilation_w - pad_left  # input column of output column ox: ox * stride + shift
            first = min(out_w, max(0, -(shift // stride_w)))  # first ox inside the input
            last = min(out_w, max(first, (width - 1 - shift) // stride_w + 1)) if width > shift else first
            row = cols[(c * kernel_h + i) * kernel_w + j]
            if stride_w == 1 and stride_h == 1 and out_w == width:
                _shifted_rows(x[c].reshape(-1), row, i * dilation_h - pad_top, shift, width, height, fill)
                continue
            for oy in range(out_h):
                y = oy * stride_h - pad_top + i * dilation_h
                base = oy * out_w
                if y < 0 or y >= height:
                    row[base : base + out_w] = fill
                    continue
                row[base : base + first] = fill
                row[base + last : base + out_w] = fill
                start = first * stride_w + shift
                source = x[c, y]
                if stride_w == 1:
                    _copy(row, base + first, source, start, last - first)
                    continue
                into, out_of = row[base + first : base + last], source[start:]
                for t in range(last - first):  # range indices: no negative-index checks
                    into[t] = out_of[t * stride_w]


IM2COL = SliceFunction(_im2col_slice)


@njit(**NATIVE)
def _pad_slice(s, _step, bounds, x, fill, pad_top, pad_left, padded_h, padded_w, padded):
    """Slice ``s`` of :data:`PAD`: channels ``bounds[s] .. bounds[s + 1]`` of ``x`` (C, H, W)
    into ``padded`` (flat, (C, padded_h, padded_w) first), ``fill`` around each plane."""
    height, width = x.shape[1], x.shape[2]
    plane = padded_h * padded_w
    flat = x.reshape(-1)
    for c in range(bounds[s], bounds[s + 1]):
        base = c * plane
        if BYTE_LANES > 0:  # the plane filled, then each row as masked vectors: rows are short
            whole = padded[base : base + plane]
            for i in range(plane):  # range indices: no negative-index checks, so it vectorizes
                whole[i] = fill
            for y in range(height):
                at = base + (pad_top + y) * padded_w + pad_left
                copy_row(padded, at, flat, (c * height + y) * width, width)
            continue
        for i in range(pad_top * padded_w):
            padded[base + i] = fill
        for y in range(height):
            at = base + (pad_top + y) * padded_w
            source = x[c, y]
            for i in range(pad_left):
                padded[at + i] = fill
            for i in range(width):
                padded[at + pad_left + i] = source[i]
            for i in range(pad_left + width, padded_w):
                padded[at + i] = fill
        for i in range((pad_top + height) * padded_w, plane):
            padded[base + i] = fill


PAD = SliceFunction(_pad_slice)
