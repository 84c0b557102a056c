"""Gemm, MatMul, MatMulBias, MatMulInteger and QLinearMatMul kernels: numpy's matmul (BLAS) does the work."""

from __future__ import annotations

import numpy as np

from flowrt.errors import ShapeError
from flowrt.workers.cpu.ref.kernels import ref_kernel
from flowrt.workers.cpu.ref.kernels.conv import compute_dtype


@ref_kernel("Gemm")
def gemm(desc, a, b, c=None):
    work = compute_dtype(a.dtype)
    a = a.T if desc.transA else a
    b = b.T if desc.transB else b
    y = np.matmul(a.astype(work, copy=False), b.astype(work, copy=False))
    if desc.alpha != 1:
        y = y * desc.alpha
    if c is not None and desc.beta != 0:
        if not desc.broadcasts_c and c.shape != y.shape:
            raise ShapeError(
                f"Gemm (opset {desc.opset}, broadcast=0) expects C of shape {y.shape}, got {c.shape}"
            )
        y = y + (c.astype(work, copy=False) if desc.beta == 1 else c * desc.beta)
    return y.astype(a.dtype, copy=False)


@ref_kernel("MatMul")
def matmul(desc, a, b):
    work = compute_dtype(a.dtype)
    return np.matmul(a.astype(work, copy=False), b.astype(work, copy=False)).astype(a.dtype, copy=False)


@ref_kernel("MatMulBias")
def matmul_bias(desc, a, b, bias=None, z=None):
    """A @ B, plus the bias along the columns and the residual Z where given."""
    y = np.matmul(a, b)
    for term in (bias, z):
        if term is not None:
            y = y + term
    return y.astype(a.dtype, copy=False)


@ref_kernel("TransposedMatMul")
def transposed_matmul(desc, a, b):
    """Transpose(alpha * Transpose(A, perm_a) @ Transpose(B, perm_b), perm_y)."""
    work = compute_dtype(a.dtype)
    a, b = (x if perm is None else np.transpose(x, perm) for x, perm in ((a, desc.perm_a), (b, desc.perm_b)))
    y = np.matmul(a.astype(work, copy=False), b.astype(work, copy=False))
    y = (y * work.type(desc.alpha) if desc.alpha != 1 else y).astype(a.dtype, copy=False)
    return y if desc.perm_y is None else np.ascontiguousarray(np.transpose(y, desc.perm_y))


def _per_row(values: np.ndarray, a: np.ndarray) -> np.ndarray:
    """A per-tensor or per-row quantization parameter of A, shaped to broadcast over A's rows:
    a vector of M entries belongs to the M rows, so it becomes a column."""
    if values.ndim == 1 and values.size > 1 and a.ndim >= 2:
        return values.reshape(-1, 1)
    return values


def _integer_product(a, a_zero_point, b, b_zero_point) -> np.ndarray:
    """(A - a_zero_point) @ (B - b_zero_point), exactly. It runs in float64 so that BLAS does the
    work: 8-bit products summed over fewer than 2**37 terms stay exact in a 53-bit mantissa."""
    a64 = a.astype(np.float64)
    b64 = b.astype(np.float64)
    if a_zero_point is not None:
        a64 -= _per_row(a_zero_point, a)
    if b_zero_point is not None:
        b64 -= b_zero_point
    return np.matmul(a64, b64)


@ref_kernel("MatMulInteger")
def matmul_integer(desc, a, b, a_zero_point=None, b_zero_point=None):
    return _integer_product(a, a_zero_point, b, b_zero_point).astype(np.int32)


@ref_kernel("QLinearMatMul")
def qlinear_matmul(desc, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    product = _integer_product(a, a_zero_point, b, b_zero_point)
    # The combined scale in the scales' own precision, as ONNX Runtime folds it.
    scale = _per_row(a_scale, a) * b_scale / y_scale
    y = np.rint(product * scale) + y_zero_point
    limits = np.iinfo(y_zero_point.dtype)
    return np.clip(y, limits.min, limits.max).astype(y_zero_point.dtype)


def qgemm_scale(alpha: float, a_scale, b_scale, y_scale) -> np.ndarray:
    """QGemm's output scale per column, in float32 as ONNX Runtime forms it:
    ``alpha * a_scale * b_scale``, divided by ``y_scale`` when there is one."""
    scale = np.float32(alpha) * np.asarray(a_scale, np.float32).reshape(()) * np.asarray(b_scale, np.float32)
    if y_scale is not None:
        scale = scale / np.asarray(y_scale, np.float32).reshape(())
    return scale.astype(np.float32).reshape(-1)


@ref_kernel("QGemm")
def qgemm(desc, a, a_scale, a_zero_point, b, b_scale, b_zero_point, c=None, y_scale=None, y_zero_point=None):
    """ONNX Runtime's QGemm: the exact integer product plus C, times the output scale in
    float32; quantized (round half to even, saturated) when ``y_scale`` is given."""
    a = a.T if desc.transA else a
    b = b.T if desc.transB else b
    b_zero = np.asarray(b_zero_point).reshape(-1)
    product = _integer_product(
        a, np.asarray(a_zero_point).reshape(()), b, b_zero if b_zero.size > 1 else b_zero[0]
    )
    if c is not None:
        product = product + c
    y = product.astype(np.int32).astype(np.float32) * qgemm_scale(desc.alpha, a_scale, b_scale, y_scale)
    if y_scale is None:
        return y
    zero = np.asarray(y_zero_point).reshape(())
    limits = np.iinfo(zero.dtype)
    return np.clip(np.rint(y) + zero.astype(np.float32), limits.min, limits.max).astype(zero.dtype)
