"""BitCast kernel."""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.bitcast import bitcast_target
from flowrt.types import DataType
from flowrt.workers.cpu.ref.kernels import ref_kernel


@ref_kernel("BitCast")
def bitcast(desc, x):
    target = bitcast_target(desc, DataType.from_numpy(x.dtype)).numpy
    # ONNX defines the bytes as little endian; a big-endian array is swapped to it first.
    little = np.asarray(x, dtype=x.dtype.newbyteorder("<"), order="C")
    return little.view(target.newbyteorder("<")).astype(target, copy=False)
