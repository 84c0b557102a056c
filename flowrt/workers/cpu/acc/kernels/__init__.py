"""CpuAcc kernels: numba, compiled ``nogil`` and cached, each computing the slices of its
execution window in one parallel region.

A kernel is a class registered per layer kind with :func:`acc_kernel`:

- ``supports(info) -> Support`` (classmethod): whether it takes this layer (types, attributes);
- ``__init__(info, workers)``: the one-time work at load (weight packing, the window split,
  numba warm-up is left to the first call);
- ``split_hint``: how its window may be cut: the slices, at most one per worker, are computed
  once at load with ``flowrt.engine.scheduler.window.split_bounds``, and each slice is one task
  of a ``SliceFunction`` (``calls.py``: compiled once on its own, run in parallel by
  ``run_tasks``; numba's own parallel loops compile several times slower). A window of one
  slice runs on the calling thread, with no parallel region: a parallel region wakes the
  other threads even when it has nothing to give them, which costs more than small work
  itself (2 µs against 25-250 µs on a shared 2-core machine);
- ``execute(inputs, outputs=None) -> outputs``: one run, all slices, blocking. ``outputs``, when
  given, holds one preallocated C-contiguous array per output (planned pool memory) to write
  into; the kernel returns them. When None, the kernel allocates its outputs.
- ``takes_job`` (optional, true): the kernel plans its split per call, by the threads the job
  running it has now; it is then called ``execute(inputs, outputs, job)``, ``job`` the job's
  ``flowrt.engine.scheduler.job.JobContext`` (None off a job: it splits over its own
  ``workers``). Other kernels never see the job.

A kernel whose layer has a fused activation (``info.activation``) applies it with
``epilogue.activate`` as it stores each value.
"""

from __future__ import annotations

import atexit
import gc
import importlib
from collections.abc import Callable
from typing import Protocol, TypeVar

from flowrt.registry import Support, WorkloadInfo
from flowrt.registry.kernel_modules import import_kernel_modules
from flowrt.types import DataType
from flowrt.workers.cpu import threading_layer
from flowrt.workers.cpu.acc import cache_stamp

# Every kernel module is imported after this package, and nothing compiles or runs a numba
# parallel region before one is: numba's threading layer is chosen here, before it starts
# (process-wide, so not when flowrt is imported; see threading_layer.py). So are the disk
# cache's locators for this package (``cache_stamp.py``), before any kernel is jitted.
threading_layer.prepare()
cache_stamp.register()

# numba's type system and the kernels' modules are some 150,000 objects that live until the
# process ends. At exit, the objects left are frozen out of the cyclic collector: the
# interpreter's own collections at shutdown would otherwise walk them all, 0.3-0.4 s of every
# process that ran CpuAcc (resnet50's fresh process to its first output: 2.26 -> 1.85 s).
# atexit calls it after every handler registered later (the user's), as the last thing
# before the interpreter tears down; nothing frozen is collected while the program runs.
atexit.register(gc.freeze)


class AccKernel(Protocol):
    """A kernel class as :func:`acc_kernel` registers it (see above)."""

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support: ...

    def __init__(self, info: WorkloadInfo, workers: int) -> None: ...


K = TypeVar("K", bound=type[AccKernel])

ACC_KERNELS: dict[str, type[AccKernel]] = {}


def acc_kernel(*names: str) -> Callable[[K], K]:
    """Register the decorated kernel class for each named layer kind."""

    def register(cls: K) -> K:
        for name in names:
            if name in ACC_KERNELS:
                raise ValueError(f"CpuAcc kernel for {name!r} registered twice")
            ACC_KERNELS[name] = cls
        return cls

    return register


# Where each kind's kernel is registered: a load imports only the modules of the kinds it asks
# for (numba's dispatchers and the modules' own set-up are some 0.1 s in all). Checked against
# the registry by tests/workers/cpu/acc/test_kernel_index.py.
_KINDS_BY_MODULE = {
    "activation": "Clip Elu Gelu HardSigmoid HardSwish LeakyRelu Mish Relu Sigmoid Softplus Softsign Swish Tanh",
    "cast": "Cast CastLike",
    "concat": "Concat",
    "conv": "Conv FusedConv",
    "conv_transpose": "ConvTranspose",
    "elementwise": "Add Div Max Min Mul Pow Sub Sum",
    "expand": "Expand Tile",
    "gather": "Gather",
    "gather_nd": "GatherND",
    "gemm": "Gemm MatMul MatMulBias",
    "global_pooling": "GlobalAveragePool GlobalMaxPool",
    "logical": "And Not Or Xor",
    "normalization": "BatchNormalization LRN LayerNormalization",
    "pad": "Pad",
    "pooling": "AveragePool MaxPool",
    "qlinear": "QLinearConv QLinearMatMul QGemm",
    "qlinear_binary": "QLinearAdd QLinearMul",
    "quantize": "DequantizeLinear QuantizeLinear",
    "recurrent": "GRU LSTM RNN",
    "reduce": "ReduceMax ReduceMean ReduceSum",
    "reshape": "Flatten Reshape Squeeze Unsqueeze",
    "resize": "Resize Upsample",
    "rms_norm": "RMSNormalization",
    "slice": "Slice",
    "softmax": "LogSoftmax Softmax",
    "split": "Split",
    "transpose": "Transpose",
    "unary": "Abs Ceil Cos Erf Exp Floor Log Neg Reciprocal Round Sign Sin Sqrt",
    "where": "Where",
}
KERNEL_MODULES: dict[str, str] = {
    kind: module for module, kinds in _KINDS_BY_MODULE.items() for kind in kinds.split()
}


def kernel_for(kind: str) -> type[AccKernel] | None:
    """The kernel registered for ``kind``, importing only its module; None when there is none."""
    found = ACC_KERNELS.get(kind)
    if found is None and kind in KERNEL_MODULES:
        importlib.import_module(f"{__name__}.{KERNEL_MODULES[kind]}")
        found = ACC_KERNELS.get(kind)
    return found


def load_all() -> dict[str, type[AccKernel]]:
    """Import every kernel module (registering its kernels), once, and return the table."""
    import_kernel_modules(__name__)
    return ACC_KERNELS


def float32_data(info: WorkloadInfo) -> Support:
    """Support.yes when the layer's data input (its first) is float32; the reason otherwise."""
    x = info.inputs[0] if info.inputs else None
    if x is None or x.dtype is not DataType.FLOAT32:
        return Support.no(f"CpuAcc {info.kind} takes float32 only")
    return Support.yes()
