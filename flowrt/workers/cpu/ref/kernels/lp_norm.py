"""LpNormalization, Shrink and Swish kernels."""

from __future__ import annotations

import numpy as np

from flowrt.workers.cpu.ref.kernels import ref_kernel


@ref_kernel("LpNormalization")
def lp_normalization(desc, x):
    magnitude = np.abs(x) if desc.p == 1 else np.square(x)
    norm = np.sum(magnitude, axis=desc.axis, keepdims=True)
    if desc.p == 2:
        norm = np.sqrt(norm)
    # A zero norm means an all-zero row: it stays zero rather than 0/0.
    safe = np.where(norm == 0, np.ones_like(norm), norm)
    return (x / safe).astype(x.dtype, copy=False)


@ref_kernel("Shrink")
def shrink(desc, x):
    # ONNX float attributes are float32: float16 (and integer) inputs compute in float32 and
    # round once, rather than rounding the attribute to float16 first.
    bias, lambd = np.float32(desc.bias), np.float32(desc.lambd)
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))
    return out.astype(x.dtype, copy=False)


@ref_kernel("Swish")
def swish(desc, x):
    with np.errstate(over="ignore"):  # exp overflow for very negative x gives the right 0
        return (x / (1 + np.exp(-np.float32(desc.alpha) * x))).astype(x.dtype, copy=False)
