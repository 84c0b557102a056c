"""Conv and ConvTranspose kernels, and the window helpers the pooling kernels share.

Conv is im2col followed by one matmul per group: the input is padded once, each kernel cell
copies one strided slice of it into the column matrix (a loop over kernel cells, never over
output pixels), and BLAS does the rest. ConvTranspose runs the same idea backwards: one matmul
makes every input cell's kernel-sized contribution, and a loop over kernel cells adds them into
the output (col2im).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from flowrt.engine.graph.layers.conv import WindowGeometry, conv_transpose_geometry, window_geometry
from flowrt.types import DataType, static_dims
from flowrt.workers.cpu.ref.kernels import ref_kernel

_HALF_TYPES = (np.dtype(np.float16), DataType.BFLOAT16.numpy)


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype to accumulate in: float16 and bfloat16 have no BLAS and lose sums to rounding
    (float16 also overflows them), so they work in float32."""
    return np.dtype(np.float32) if dtype in _HALF_TYPES else np.dtype(dtype)


def window_slices(offset: Sequence[int], geometry: WindowGeometry) -> tuple[slice, ...]:
    """The strided slices (over a padded array's spatial axes) that kernel cell ``offset`` reads,
    one element per output position."""
    out = static_dims(geometry.out)
    return tuple(
        slice(k * d, k * d + (o - 1) * s + 1, s)
        for k, d, o, s in zip(offset, geometry.dilations, out, geometry.strides, strict=True)
    )


def pad_spatial(
    x: np.ndarray, geometry: WindowGeometry, kernel: Sequence[int], value: float | int
) -> np.ndarray:
    """``x`` padded with ``value`` so that every window of ``geometry`` lies inside it: the leading
    pads, and at the end whatever the windows reach (in ceil mode that can pass the trailing pads)."""
    spatial = x.shape[x.ndim - len(kernel) :]
    shape = list(x.shape[: x.ndim - len(kernel)])
    inner = [slice(None)] * len(shape)
    for size, begin, o, s, k, d in zip(
        spatial, geometry.pads_begin, geometry.out, geometry.strides, kernel, geometry.dilations, strict=True
    ):
        reach = (int(o) - 1) * s + (k - 1) * d + 1
        shape.append(max(reach, begin + size))
        inner.append(slice(begin, begin + size))
    if tuple(shape) == x.shape:
        return x
    padded = np.full(shape, value, dtype=x.dtype)
    padded[tuple(inner)] = x
    return padded


def im2col(padded: np.ndarray, kernel: Sequence[int], geometry: WindowGeometry) -> np.ndarray:
    """The column tensor (N, C, *kernel, *out) of a padded (N, C, *spatial) input: entry
    [n, c, k..., o...] is the input cell that kernel cell k sees at output position o."""
    lead = (slice(None), slice(None))
    if all(k == 1 for k in kernel):
        # A 1x1 kernel reads the input itself (strided when the stride is not 1).
        view = padded[lead + window_slices((0,) * len(kernel), geometry)]
        return np.ascontiguousarray(view).reshape(*padded.shape[:2], *kernel, *view.shape[2:])
    cols = np.empty((*padded.shape[:2], *kernel, *geometry.out), dtype=padded.dtype)
    for offset in np.ndindex(*kernel):
        cols[lead + offset] = padded[lead + window_slices(offset, geometry)]
    return cols


def add_bias(y: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """``y`` (N, M, spatial...) plus a per-channel bias, in place."""
    if b is not None:
        y += b.reshape(1, -1, *([1] * (y.ndim - 2))).astype(y.dtype, copy=False)
    return y


@ref_kernel("Conv")
def conv(desc, x, w, b=None):
    kernel = w.shape[2:]
    geometry = window_geometry(desc, x.shape[2:], kernel)
    work = compute_dtype(x.dtype)
    n, c = x.shape[:2]
    m, group = w.shape[0], desc.group
    cols = im2col(pad_spatial(x.astype(work, copy=False), geometry, kernel, 0), kernel, geometry)
    cols = cols.reshape(n, group, (c // group) * int(np.prod(kernel)), -1)
    # (G, M/G, C/G * K) @ (N, G, C/G * K, P) -> (N, G, M/G, P): one BLAS matmul per image and group.
    y = np.matmul(w.astype(work, copy=False).reshape(group, m // group, -1), cols)
    y = add_bias(y.reshape(n, m, *geometry.out), b)
    return y.astype(x.dtype, copy=False)


@ref_kernel("FusedConv")
def fused_conv(desc, x, w, b, z):
    """Conv + Z (the residual); the workload applies the fused activation after."""
    return conv(desc, x, w, b) + z


@ref_kernel("ConvTranspose")
def conv_transpose(desc, x, w, b=None):
    kernel = w.shape[2:]
    geometry = conv_transpose_geometry(desc, x.shape[2:], kernel)
    work = compute_dtype(x.dtype)
    n, c, spatial = x.shape[0], x.shape[1], x.shape[2:]
    group, mg = desc.group, w.shape[1]
    # (G, M/G * K, C/G) @ (N, G, C/G, P) -> every input cell's contribution to each kernel cell.
    wg = w.astype(work, copy=False).reshape(group, c // group, -1).transpose(0, 2, 1)
    cols = np.matmul(wg, x.astype(work, copy=False).reshape(n, group, c // group, -1))
    cols = cols.reshape(n, group * mg, *kernel, *spatial)
    # The full scatter result may be cropped (positive pads) or extended (negative pads or
    # output_padding); ``origin`` shifts it so that both fit in one zeroed buffer.
    origins, lengths, crop = [], [], []
    for size, k, s, d, begin, out in zip(
        spatial, kernel, geometry.strides, geometry.dilations, geometry.pads_begin, geometry.out, strict=True
    ):
        full = s * (size - 1) + (k - 1) * d + 1
        origin = max(0, -begin)
        origins.append(origin)
        lengths.append(origin + max(full, begin + out))
        crop.append(slice(origin + begin, origin + begin + out))
    y = np.zeros((n, group * mg, *lengths), dtype=work)
    lead = (slice(None), slice(None))
    for offset in np.ndindex(*kernel):
        dest = tuple(
            slice(o + k * d, o + k * d + s * (size - 1) + 1, s)
            for o, k, d, s, size in zip(
                origins, offset, geometry.dilations, geometry.strides, spatial, strict=True
            )
        )
        y[lead + dest] += cols[lead + offset]
    y = add_bias(np.ascontiguousarray(y[lead + tuple(crop)]), b)
    return y.astype(x.dtype, copy=False)
