"""Einsum kernel."""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.einsum import parse_equation
from flowrt.workers.cpu.ref.kernels import ref_kernel
from flowrt.workers.cpu.ref.kernels.conv import compute_dtype


@ref_kernel("Einsum")
def einsum(desc, *inputs):
    terms, rhs = parse_equation(desc.equation, len(inputs))
    dtype = inputs[0].dtype
    # numpy's einsum has no loop for bfloat16: it (and float16) sums in float32, as onnx's reference.
    work = compute_dtype(dtype)
    # optimize=True contracts pairwise through BLAS where it can; numpy keeps the input dtype.
    out = np.einsum(
        ",".join(terms) + "->" + rhs, *(x.astype(work, copy=False) for x in inputs), optimize=True
    )
    out = np.asarray(out).astype(dtype, copy=False)
    # A copy in order when a permuting or diagonal equation gave a strided view (np.require,
    # unlike np.ascontiguousarray, keeps a 0-d result 0-d).
    return np.require(out, requirements="C")
