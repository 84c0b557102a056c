"""Einsum kernel."""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.einsum import parse_equation
from flowrt.workers.cpu.ref.kernels import ref_kernel


@ref_kernel("Einsum")
def einsum(desc, *inputs):
    terms, rhs = parse_equation(desc.equation, len(inputs))
    # optimize=True contracts pairwise through BLAS where it can; numpy keeps the input dtype.
    out = np.asarray(np.einsum(",".join(terms) + "->" + rhs, *inputs, optimize=True))
    # A copy in order when a permuting or diagonal equation gave a strided view (np.require,
    # unlike np.ascontiguousarray, keeps a 0-d result 0-d).
    return np.require(out, requirements="C")
