"""RMSNormalization: X divided by its root mean square over the dims from ``axis`` on, then scaled."""

from __future__ import annotations

import numpy as np

from flowrt.workers.cpu.ref.kernels import ref_kernel
from flowrt.workers.cpu.ref.kernels.normalization import widened


@ref_kernel("RMSNormalization")
def rms_normalization(desc, x, scale):
    axis = desc.axis % x.ndim
    xw = widened(x)
    mean_square = np.mean(xw * xw, axis=tuple(range(axis, x.ndim)), keepdims=True)
    # Div(X, RMS) in at least float32, cast back to X's type, then scaled: ONNX's function body.
    normalized = (xw / np.sqrt(mean_square + xw.dtype.type(desc.epsilon))).astype(x.dtype, copy=False)
    return (normalized * scale).astype(scale.dtype, copy=False)
