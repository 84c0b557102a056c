"""The network outputs a run writes where they will be returned, not into its pool: those the
caller binds (``run(feeds, outputs=...)``, :func:`direct_outputs`) and large unbound ones
(:func:`own_outputs`). The executor redirects their producers' outputs there."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from flowrt.engine.scheduler.dataflow import Dataflow
    from flowrt.engine.scheduler.executor import Binding

# Unbound network outputs at least this large get a new array each run that their producer
# writes (:func:`own_outputs`): copied out of the pool instead, a 3 MiB output cost 60 us a
# run. A smaller one is copied: its producer then keeps its recorded launches.
OWN_OUTPUT_BYTES = 1 << 20


# (output name, tensor id, shape, dtype) of an output :func:`own_outputs` gives an array
LargeOutput = tuple[str, int, tuple[int, ...], np.dtype]


def large_outputs(dataflow: Dataflow, bindings: Mapping[int, Binding]) -> tuple[LargeOutput, ...]:
    """The network outputs that a host workload makes, no workload reads, one output name
    only, planned in the pool and at least ``OWN_OUTPUT_BYTES``: found once per loaded
    network, given their own arrays by :func:`own_outputs` in each run."""
    names: dict[int, int] = {}
    for tid in dataflow.outputs.values():
        names[tid] = names.get(tid, 0) + 1
    large: list[LargeOutput] = []
    for name, tid in dataflow.outputs.items():
        binding = bindings.get(tid)
        if names[tid] > 1 or binding is None or tid in dataflow.downloads or dataflow.readers.get(tid, 0):
            continue
        dtype = np.dtype(binding.dtype)
        if int(np.prod(binding.shape, dtype=np.int64)) * dtype.itemsize >= OWN_OUTPUT_BYTES:
            large.append((name, tid, tuple(binding.shape), dtype))
    return tuple(large)


def own_outputs(large: Sequence[LargeOutput], bound: Mapping[str, np.ndarray]) -> dict[int, np.ndarray]:
    """New arrays, by tensor id, for the ``large`` outputs (:func:`large_outputs`) the caller
    does not bind: their producers write them there (as into a caller's array, see
    :func:`direct_outputs`) and the run returns them with no copy."""
    return {tid: np.empty(shape, dtype) for name, tid, shape, dtype in large if name not in bound}


def direct_outputs(
    dataflow: Dataflow,
    bindings: Mapping[int, Binding],
    feeds: Mapping[str, np.ndarray],
    outputs: Mapping[str, np.ndarray],
) -> dict[int, np.ndarray]:
    """The caller's output arrays that the run writes directly, by tensor id: those of
    outputs a workload produces and no workload reads, in a C-contiguous array of the planned
    (or, downloaded from a device, the inferred) shape that shares no memory with a feed.
    The others are copied into their arrays at the end of the run."""
    feed_ids = set(dataflow.inputs.values())
    downloads = dataflow.downloads
    direct: dict[int, np.ndarray] = {}
    for name, array in outputs.items():
        tid = dataflow.outputs[name]
        made = tid not in feed_ids and tid not in dataflow.constants  # by a workload
        if tid in direct or not made or dataflow.readers.get(tid, 0):
            continue
        host_feeds = (f for f in feeds.values() if isinstance(f, np.ndarray))  # not DeviceArrays
        if not array.flags.c_contiguous or any(np.may_share_memory(array, f) for f in host_feeds):
            continue
        binding = bindings.get(tid)
        if tid in downloads:
            info = dataflow.tensor_infos.get(tid)
            shape = info.shape if info is not None else None
        else:
            shape = binding.shape if binding is not None else array.shape
        if shape is None or tuple(shape) != array.shape:
            continue
        direct[tid] = array
    return direct
