"""SwiGLU kernel."""

from __future__ import annotations

import numpy as np

from flowrt.errors import DataTypeError, ShapeError
from flowrt.workers.cpu.ref.kernels import ref_kernel
from flowrt.workers.cpu.ref.kernels.activation import sigmoid


@ref_kernel("SwiGLU")
def swiglu(desc, gate, value):
    if gate.shape != value.shape:
        raise ShapeError(
            f"SwiGLU: A and B of one shape expected (nothing is broadcast), got {gate.shape} and {value.shape}"
        )
    if gate.dtype != value.dtype:
        raise DataTypeError(f"SwiGLU: A and B of one type expected, got {gate.dtype} and {value.dtype}")
    # float16 and bfloat16 compute in float32 and round once (float64 stays float64); alpha is
    # an ONNX float attribute, so float32.
    work = np.float64 if gate.dtype == np.float64 else np.float32
    a, b = gate.astype(work), value.astype(work)
    return (a * sigmoid(work(np.float32(desc.alpha)) * a) * b).astype(gate.dtype)
