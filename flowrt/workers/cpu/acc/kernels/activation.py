"""Activations over a flat window (every kind of the activation table: Relu, LeakyRelu, Clip,
Sigmoid, Tanh, the curves): one numba parallel region runs every slice.

The window is the flattened tensor; it is split into one slice per worker (never below
``MIN_SLICE`` elements), and each slice is a tight loop compiled ``nogil``. Work of one slice
runs on the calling thread, with no parallel region. ``FlatKernel`` is that walk, for any
elementwise function of one input (``unary.py`` runs the math functions on it).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, types
from numba._dispatcher import compute_fingerprint

from flowrt.engine.graph.layer_kind import activation_facts
from flowrt.engine.graph.passes.fuse_activation import as_fused_activation
from flowrt.engine.scheduler.window import SplitHint, split_bounds
from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.cpu.acc.calls import SliceFunction, call_native, native_address
from flowrt.workers.cpu.acc.kernels import acc_kernel, float32_data
from flowrt.workers.cpu.acc.kernels import epilogue as ep
from flowrt.workers.cpu.acc.kernels.epilogue import activate_slice

# Below this many elements per slice, a second thread costs more than it saves: a region
# starts on CpuAcc's team in about 1 us (``team.py``), a pass over a few thousand floats.
# Shared by the elementwise, normalization and softmax kernels.
MIN_SLICE = 4096


@njit(nogil=True, cache=True)
def _flat_slice(task, step, function, x, out, bounds, code, alpha, beta):
    """Slice ``task`` of a :class:`FlatKernel`'s window (a :class:`SliceFunction`), by its
    ``run_slice`` at address ``function``: one slice function serves every FlatKernel."""
    lo, hi = bounds[task], bounds[task + 1]
    call_native(function, (out[lo:hi], x[lo:hi], code, alpha, beta))


_FLAT_SLICE = SliceFunction(_flat_slice)
_SCALARS = (types.int64, types.float32, types.float32)  # run_slice's code, alpha and beta
# run_slice's address, by function and the types of (dst, src)
_RUN_SLICE_ADDRESSES: dict[tuple[object, bytes], int] = {}


def clip_bounds(info: WorkloadInfo) -> list[float | None]:
    """Clip's ``[low, high]``: the attributes before opset 11, else the constant inputs (an
    absent input is unbounded); None for a bound that is an input computed at run time."""
    if info.descriptor.opset < 11:
        fused = as_fused_activation("Clip", info.descriptor)
        assert fused is not None  # attribute bounds are always constants
        return [fused.alpha, fused.beta]
    # Not as_fused_activation here: it gives up on Clip(x, min) with min a constant, since
    # from constants alone it cannot tell an absent max from one computed at run time.
    constants = list(info.constants) + [None] * 3
    bounds: list[float | None] = []
    for i, unbounded in ((1, -np.inf), (2, np.inf)):
        if i >= len(info.inputs) or info.inputs[i] is None:
            bounds.append(unbounded)
        else:
            bounds.append(None if constants[i] is None else float(np.asarray(constants[i]).reshape(-1)[0]))
    return bounds


def activation_arguments(info: WorkloadInfo) -> tuple[int, float, float]:
    """``(code, alpha, beta)`` of an activation layer, as :func:`epilogue.activate` takes them:
    its fact's in the activation table (Clip's bounds: see :func:`clip_bounds`)."""
    if info.kind == "Clip":
        low, high = (0.0 if b is None else b for b in clip_bounds(info))
        return ep.CLIP, low, high
    fact = activation_facts()[info.kind]
    params = fact.params(info.descriptor, info.constants)
    assert params is not None  # only Clip's can be None, answered above
    return fact.code_of(fact.form(info.descriptor)), params[0], params[1]


class FlatKernel:
    """An elementwise float32 function over every element of the flattened tensor: one slice
    per worker in one parallel region, or the whole on the calling thread when it is small.

    A subclass gives ``run_slice(dst, src, code, alpha, beta)`` (njit), and sets ``code``,
    ``alpha`` and ``beta``; the slices run it by address (no parallel loop of its own to
    compile)."""

    split_hint = SplitHint(axis=0, min_slice=MIN_SLICE)
    run_slice = staticmethod(activate_slice)

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        self.info = info
        self.workers = workers
        self.code, self.alpha, self.beta = ep.NONE, np.float32(0), np.float32(0)
        self._bounds: dict[int, np.ndarray] = {}

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        return float32_data(info)

    def bounds(self, size: int) -> np.ndarray:
        """Slice boundaries for a flat size (computed once per size)."""
        cached = self._bounds.get(size)
        if cached is None:
            cached = self._bounds[size] = split_bounds(size, self.split_hint, self.workers)
        return cached

    def arguments(self, inputs) -> tuple[np.float32, np.float32]:
        """``(alpha, beta)`` for this run."""
        return self.alpha, self.beta

    def execute(self, inputs, outputs=None):
        x = np.asarray(inputs[0], order="C")  # not ascontiguousarray: it makes a 0-d array 1-d
        out = np.empty_like(x) if outputs is None else outputs[0]
        flat, flat_out = x.reshape(-1), out.reshape(-1)
        alpha, beta = self.arguments(inputs)
        bounds = self.bounds(flat.size)
        if bounds.shape[0] <= 2:
            self.run_slice(flat_out, flat, self.code, alpha, beta)
        else:
            key = (self.run_slice, compute_fingerprint((flat_out, flat)))
            address = _RUN_SLICE_ADDRESSES.get(key)
            if address is None:
                signature = (numba.typeof(flat_out), numba.typeof(flat), *_SCALARS)
                address = _RUN_SLICE_ADDRESSES[key] = native_address(self.run_slice, signature)
            _FLAT_SLICE.run(bounds.shape[0] - 1, (address, flat, flat_out, bounds, self.code, alpha, beta))
        return [out]


@acc_kernel(*ep.CODES)
class ActivationKernel(FlatKernel):
    """One activation over every element, split into slices across the CPU workers: every
    activation of the activation table (the epilogue has each one's code).

    Clip's bounds that are inputs computed at run time are read from each run's inputs."""

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        super().__init__(info, workers)
        code, alpha, beta = activation_arguments(info)
        self.code, self.alpha, self.beta = code, np.float32(alpha), np.float32(beta)
        # Clip's bounds (0: low, 1: high) that are inputs computed at run time
        self.run_time_bounds = (
            [i for i, b in enumerate(clip_bounds(info)) if b is None] if info.kind == "Clip" else []
        )

    def arguments(self, inputs) -> tuple[np.float32, np.float32]:
        """``(alpha, beta)`` for this run: Clip's bounds not known at load read from its inputs."""
        values = [self.alpha, self.beta]
        for i in self.run_time_bounds:
            values[i] = np.float32(np.asarray(inputs[i + 1]).reshape(-1)[0])
        return values[0], values[1]
