"""Resize and Upsample: resize.cl gathers the taps that the host computes per dim, with the
coordinate mapping, rounding and interpolation weights every backend shares
(``flowrt.engine.graph.layers.resize_coordinates``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.engine.graph.layers.resize import ResizeDescriptor, resize_inputs, resize_plan
from flowrt.engine.graph.layers.resize_coordinates import (
    interpolation_taps,
    nearest_index,
    source_coordinates,
)
from flowrt.errors import BackendError
from flowrt.workers.gpu.device import cl
from flowrt.workers.gpu.kernels import RANK, GpuKernel, gpu_kernel, static_shape
from flowrt.workers.gpu.kernels.elementwise import broadcast_strides
from flowrt.workers.gpu.tensor import GpuTensor


def axis_taps(desc: ResizeDescriptor, in_len: int, out_len: int, scale: float, roi: Any):
    """(indices, weights, outside) of one dim: (out_len, taps) input indices and weights, and
    a flag per output index that reads the extrapolation value."""
    whole = roi is None or (math.isclose(roi[0], 0.0) and math.isclose(roi[1], 1.0))
    if math.isclose(scale, 1.0) and out_len == in_len and whole:  # nothing moves along it
        return np.arange(out_len)[:, None], np.ones((out_len, 1)), np.zeros(out_len, bool)
    x = source_coordinates(desc, out_len, in_len, scale, roi)
    if desc.mode == "nearest":
        picked = np.clip(nearest_index(desc, x, scale), 0, in_len - 1)
        indices, weights = picked[:, None], np.ones((out_len, 1))
    else:
        indices, weights = interpolation_taps(desc, x, in_len, scale)
    outside = np.zeros(out_len, bool)
    if not desc.legacy and desc.coordinate_transformation_mode == "tf_crop_and_resize":
        outside = (x < 0) | (x > in_len - 1)
    return indices, weights.astype(np.float32), outside


def _buffer(context: Any, array: np.ndarray) -> Any:
    flags = cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR
    return cl.Buffer(context.context, flags, hostbuf=np.ascontiguousarray(array))


class ResizeTables:
    """resize.cl's geometry, tap index, tap weight and outside-flag buffers for one input shape."""

    def __init__(self, context: Any, desc: ResizeDescriptor, shape: Sequence[int], out, scales, roi) -> None:
        rank, lead = len(shape), RANK - len(shape)
        taps = [
            axis_taps(
                desc,
                shape[d],
                int(out[d]),
                float(scales[d]),
                None if roi is None else (roi[d], roi[d + rank]),
            )
            for d in range(rank)
        ]
        one = (np.zeros((1, 1), np.int64), np.ones((1, 1), np.float32), np.zeros(1, bool))
        taps = [one] * lead + taps
        counts = [t[0].shape[1] for t in taps]
        tap_starts = np.cumsum([0] + [t[0].size for t in taps[:-1]])
        flag_starts = np.cumsum([0] + [t[2].size for t in taps[:-1]])
        dims = [1] * lead + [int(o) for o in out]
        geometry = [*dims, *broadcast_strides(shape, shape), *counts, *tap_starts, *flag_starts]
        self.geometry = _buffer(context, np.array(geometry, np.int32))
        self.index = _buffer(context, np.concatenate([t[0].reshape(-1) for t in taps]).astype(np.int32))
        self.weight = _buffer(context, np.concatenate([t[1].reshape(-1) for t in taps]).astype(np.float32))
        self.outside = _buffer(context, np.concatenate([t[2] for t in taps]).astype(np.uint8))


@gpu_kernel("Resize", "Upsample")
class ResizeKernel(GpuKernel):
    """Resize (and Upsample, as the opset-10 Resize it equals) with constant roi, scales and sizes."""

    host_inputs = frozenset({1, 2, 3})

    def prepare(self) -> None:
        self.kernel = self.context.kernel("resize", "resize")
        shape = static_shape(self.info.inputs[0])
        desc = self.info.descriptor
        given = [self.constant(i) for i in range(1, len(self.info.inputs))]
        missing = [i + 1 for i, v in enumerate(given) if v is None and self.info.inputs[i + 1] is not None]
        if missing:
            raise BackendError(
                f"GpuAcc {self.info.kind} {self.info.layer_name!r} expects constant roi, scales "
                f"and sizes; inputs {missing} are computed at run time"
            )
        if self.info.kind == "Upsample":
            scales = desc.scale_values(given[0] if given else None)
            desc = desc.as_resize()
            out = [int(np.floor(d * f)) for d, f in zip(shape, scales, strict=True)]
            roi = None
        else:
            out, scales, roi = resize_plan(desc, shape, *resize_inputs(desc, given))
        self.tables = ResizeTables(self.context, desc, shape, out, scales, roi)
        self.extrapolation = np.float32(getattr(desc, "extrapolation_value", 0.0))

    def enqueue(self, queue: Any, inputs: Sequence[Any], outputs: Sequence[GpuTensor]) -> Any:
        x, y, t = inputs[0], outputs[0], self.tables
        return self.launch(
            self.kernel, queue, y.size, *x.kernel_args, *y.kernel_args, t.geometry, t.index, t.weight,
            t.outside, np.int32(y.size), self.extrapolation,
        )  # fmt: skip
