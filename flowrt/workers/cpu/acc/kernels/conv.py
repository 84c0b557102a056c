"""Conv (2-D, NCHW, float32), with bias and the fused activation applied as each output block
is written: CpuAcc's registered kernel, which chooses an algorithm per input shape.

The algorithms are modules of ``flowrt.workers.cpu.acc.conv`` (depthwise, grouped, Winograd,
tap by tap, batched, packed 1x1, im2col by columns or rows): the first of
``conv.algorithms.ALGORITHMS`` whose ``applies(geometry, tuning)`` holds takes the shape, as
the Compute Library's ``NEConvolutionLayer`` chooses. Its plan (splits, chunks) is made once
per input shape, weight shape and worker count and kept; each call runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import njit

from flowrt.engine.scheduler.job import JobContext
from flowrt.engine.scheduler.window import SplitHint
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import DataType
from flowrt.workers.cpu.acc.blas import pin_scipy_blas, read_only
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.conv.algorithms import ConvAlgorithm, choose
from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
from flowrt.workers.cpu.acc.conv.tuning import MIN_COLUMNS, ConvTuning
from flowrt.workers.cpu.acc.conv.weights import ConvWeights
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.acc.kernels.epilogue import NONE, activate_in_place, activation_args

pin_scipy_blas()

DEFAULT_TUNING = ConvTuning()
# The layers of a network optimized with ``fast_math``: less exact algorithms allowed.
FAST_MATH_TUNING = ConvTuning(fast_math=True)
# The activation arguments of none (``epilogue.activation_args``).
NO_ACTIVATION = activation_args(None)


@acc_kernel("Conv")
class ConvKernel:
    """2-D float32 Conv with groups, strides, dilations, pads and auto_pad; bias and the fused
    activation are applied as each output block is written. ``tuning`` (default
    :data:`DEFAULT_TUNING`, or :data:`FAST_MATH_TUNING` where ``info.fast_math``) holds the
    knobs of its splits and of the choice of algorithm."""

    split_hint = SplitHint(axis=2, min_slice=MIN_COLUMNS)  # output pixels, (N, M, pixels)
    # Its split is planned per call, by the threads the job running it has now.
    takes_job = True

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        x, w = info.inputs[0], info.inputs[1]
        if any(t is not None and t.dtype is not DataType.FLOAT32 for t in info.inputs):
            return Support.no("CpuAcc Conv takes float32 only")
        ranks = {len(t.shape) for t in (x, w) if t is not None and t.shape is not None}
        if ranks != {4}:
            found = "unknown" if not ranks else " and ".join(str(r - 2) for r in sorted(ranks))
            return Support.no(f"CpuAcc Conv takes 2-D spatial data (rank 4) only, got {found}-D")
        return Support.yes()

    def __init__(self, info: WorkloadInfo, workers: int, tuning: ConvTuning | None = None) -> None:
        self.info = info
        self.workers = workers
        self.tuning = tuning or (FAST_MATH_TUNING if info.fast_math else DEFAULT_TUNING)
        self.desc = info.descriptor
        self.act = activation_args(info.activation)
        self.code = self.act[0]
        constants = tuple(info.constants) + (None,) * 3
        self.weights = ConvWeights(self.desc.group, constants[1], info.fp16_weights)
        self.bias = None if constants[2] is None else np.ascontiguousarray(constants[2], np.float32)
        # the bias every run passes when it is the layer's constant, or there is none: made once
        # (a call's own Python is most of a small conv's time: 1-2 us of about 10)
        self._bias_ro = read_only(self.bias) if self.bias is not None else None
        # (input shape, weight shape, workers) -> the chosen algorithm's plan, the output shape
        self._plans: dict[tuple[int, ...], tuple[ConvAlgorithm, tuple[int, ...]]] = {}

    def plan(
        self, x_shape: tuple[int, ...], w_shape: tuple[int, ...], workers: int | None = None
    ) -> ConvAlgorithm:
        """The plan of the algorithm chosen for one input shape over ``workers`` (default: the
        kernel's), made once per shape and worker count."""
        return self._chosen(x_shape, w_shape, self.workers if workers is None else workers)[0]

    def _chosen(
        self, x_shape: tuple[int, ...], w_shape: tuple[int, ...], workers: int
    ) -> tuple[ConvAlgorithm, tuple[int, ...]]:
        key = (*x_shape, *w_shape, workers)
        cached = self._plans.get(key)
        if cached is None:
            geometry = ConvGeometry.of(self.desc, x_shape, w_shape, workers)
            cached = self._plans[key] = (choose(geometry, self.tuning, self.weights.made), geometry.out_shape)
        return cached

    def make_forms(self, shapes: Sequence[tuple[int, ...] | None], job: JobContext | None = None) -> None:
        """Make what a run on inputs of ``shapes`` in ``job`` derives from the constant weights
        (the chosen algorithm's forms of them), without running."""
        weights = self.weights
        if weights.packed is None or weights.shape is None or shapes[0] is None:
            return
        if self.bias is None and len(shapes) > 2 and shapes[2] is not None:
            return  # the bias comes with each run: nothing derived is kept
        workers = self.workers if job is None else min(self.workers, job.threads)
        plan, _ = self._chosen(tuple(shapes[0]), weights.shape, workers)
        forms = getattr(plan, "forms", None)
        if forms is not None:
            bias = (
                self._bias_ro
                if self._bias_ro is not None
                else read_only(np.zeros(weights.shape[0], np.float32))
            )
            forms(weights, weights.packed, weights.shape, bias, True)

    def execute(self, inputs: Any, outputs: Any = None, job: JobContext | None = None) -> list[np.ndarray]:
        plan, operands, out, finish, constant = self._operands(inputs, outputs, job)
        plan.run(*operands, out, finish, constant, self.act)
        return [out]

    def _operands(self, inputs: Any, outputs: Any, job: JobContext | None) -> tuple:
        """The plan for this call, the operands its ``run`` takes before ``out`` (weights, x,
        w, w_shape, bias), the output, whether there is a bias or activation to apply, and
        whether the weights and bias are the layer's constants."""
        x = np.ascontiguousarray(inputs[0], np.float32)
        weights = self.weights
        w, w_shape = weights.packed, weights.shape
        if w is None or w_shape is None:  # the weights are an input: packed per call
            w, w_shape = weights.pack(inputs[1]), tuple(inputs[1].shape)
        # as many slices as the job has threads now: a run sharing the cores with others
        # steps down to one, and one slice runs wider GEMMs than two run one after the other
        workers = self.workers if job is None else min(self.workers, job.threads)
        plan, out_shape = self._chosen(x.shape, w_shape, workers)
        out = np.empty(out_shape, np.float32) if outputs is None else outputs[0]
        b = self.bias if self.bias is not None else inputs[2] if len(inputs) > 2 else None
        finish = b is not None or self.code != NONE
        if b is self.bias and self._bias_ro is not None:  # the layer's own bias
            bias = self._bias_ro
        else:
            bias = read_only(
                np.zeros(w_shape[0], np.float32) if b is None else np.ascontiguousarray(b, np.float32)
            )
        # the operands are the layer's constants: what the algorithm derives from them is kept
        constant = w is weights.packed and (self.bias is not None or b is None)
        return plan, (weights, x, w, w_shape, bias), out, finish, constant


@njit(**NATIVE)
def _add_residual(task, _step, out, z, tasks, code, alpha, beta):
    """Task ``task`` of ``tasks``: ``out = activation(out + z)`` over its share of the flat
    float32 arrays (of one size), in runs of ``RESIDUAL_RUN`` that are still in L1 for the
    activation."""
    size = out.shape[0]
    start, stop = task * size // tasks, (task + 1) * size // tasks
    for first in range(start, stop, RESIDUAL_RUN):
        last = min(stop, first + RESIDUAL_RUN)
        for i in range(np.uint64(first), np.uint64(last)):
            out[i] += z[i]
        activate_in_place(out[first:last], code, alpha, beta)


# Values of a residual added at a time, then activated (16 KB).
RESIDUAL_RUN = 4096
_ADD_RESIDUAL = SliceFunction(_add_residual)


@acc_kernel("FusedConv")
class FusedConvKernel(ConvKernel):
    """FusedConv (``act(Conv(X, W, B) + Z)``, what the optimizer makes of a Conv and the
    residual Add reading it, ONNX Runtime's FusedConv with Z): the algorithms whose register
    tiles store the output (``takes_residual``) copy each block of Z into the output just
    before their tiles start from it, so that Z is read once and the sum is never stored and
    read back; the others run the conv with no activation, then add Z and apply it over the
    output in parallel slices."""

    def execute(self, inputs: Any, outputs: Any = None, job: JobContext | None = None) -> list[np.ndarray]:
        plan, operands, out, _, constant = self._operands(inputs, outputs, job)
        z = np.ascontiguousarray(inputs[3], np.float32)
        if getattr(plan, "takes_residual", False):
            plan.run(*operands, out, True, constant, self.act, residual=z)
        else:
            plan.run(*operands, out, True, constant, NO_ACTIVATION)
            tasks = self.workers if job is None else min(self.workers, job.threads)
            _ADD_RESIDUAL.run(tasks, (out.reshape(-1), z.reshape(-1), np.int64(tasks), *self.act))
        return [out]
