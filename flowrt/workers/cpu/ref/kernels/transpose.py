"""Transpose, DepthToSpace and SpaceToDepth kernels: a reshape, a transpose, a reshape."""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.transpose import transpose_perm
from flowrt.workers.cpu.ref.kernels import ref_kernel


@ref_kernel("Transpose")
def transpose(desc, data):
    # Contiguous, so the layers after it read memory in order.
    return np.ascontiguousarray(np.transpose(data, transpose_perm(desc.perm, data.ndim)))


@ref_kernel("DepthToSpace")
def depth_to_space(desc, data):
    n, c, h, w = data.shape
    b = desc.blocksize
    if desc.mode == "DCR":
        blocks = data.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        blocks = data.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return np.ascontiguousarray(blocks).reshape(n, c // (b * b), h * b, w * b)


@ref_kernel("SpaceToDepth")
def space_to_depth(desc, data):
    n, c, h, w = data.shape
    b = desc.blocksize
    blocks = data.reshape(n, c, h // b, b, w // b, b)
    # DCR puts the block offset before the channel, CRD after it.
    order = (0, 3, 5, 1, 2, 4) if desc.mode == "DCR" else (0, 1, 3, 5, 2, 4)
    return np.ascontiguousarray(blocks.transpose(order)).reshape(n, c * b * b, h // b, w // b)
