"""GpuAcc kernels: OpenCL C sources (``*.cl``) and one small Python module per family.

A kernel class is registered per layer kind with :func:`gpu_kernel`. The layer support asks
its ``supports(info)``; the workload factory makes one per layer, ``prepare()``s it at load
(programs built, constants uploaded) and calls ``enqueue(queue, inputs, outputs)`` per run,
with one GpuTensor per device input (host arrays for the slots in ``host_inputs``) and one
preallocated GpuTensor per output (planned pool memory, or new buffers), which it writes.
``enqueue`` puts its commands on ``queue`` without waiting and returns the event of the last
one. A view kernel (``is_view``) writes nothing: ``view(inputs)`` returns its outputs as views
of its input. A kernel that applies ``info.activation`` itself sets ``fuses_activation``; for
the others the workload runs the activation afterwards.

A one-dimensional kernel (one work-item per element, skipping those past its count) is
launched with :meth:`GpuKernel.launch`, which takes its local work size from the tuner.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from flowrt.engine.graph.layer_kind import NO_ACTIVATION, activation_code, activation_facts, activation_kinds
from flowrt.errors import BackendError, ShapeError
from flowrt.registry import FusedActivation, Support, WorkloadInfo
from flowrt.registry.kernel_modules import import_kernel_modules
from flowrt.types import DataType, TensorInfo, static_dims
from flowrt.workers.gpu.tensor import GpuTensor
from flowrt.workers.gpu.tuner import DEFAULT_LOCAL_SIZE, Tuner

# One-dimensional kernels run in work-groups of this size unless tuned (PoCL compiles a
# kernel once per work-group size it meets).
LOCAL_SIZE = DEFAULT_LOCAL_SIZE
RANK = 6  # the largest rank strided_offset handles


# The activation table's curves (fused only by the backends that offer them) that GpuAcc
# applies too: MobileNetV3's, the transformers' Gelu (its exact, erf form and GPT-2's tanh
# one), and Swish (SiLU with alpha 1: LLaMA's feed-forward gate).
GPU_CURVES = frozenset({"HardSigmoid", "HardSwish", "Gelu", "Swish"})


@functools.cache
def activation_codes() -> dict[str, int]:
    """The codes of common.cl's ``activate()``, by kind: the activation table's kinds fused
    "everywhere", which every backend that fuses activations applies, and ``GPU_CURVES``
    (common.cl spells each as an ``ACT_`` macro; tests/workers/gpu/test_activation_codes.py
    checks they agree)."""
    facts = activation_facts()
    kinds = sorted({*activation_kinds("everywhere"), *GPU_CURVES}, key=lambda kind: facts[kind].code)
    return {kind: facts[kind].code for kind in kinds}


def activation_args(activation: FusedActivation | None) -> tuple[np.int32, np.float32, np.float32]:
    """The (code, alpha, beta) kernel arguments of ``activate()``; code 0 is none.
    BackendError for an activation GpuAcc does not apply (a ``.flowrt`` file edited by hand
    may carry one the optimizer would never have fused here)."""
    if activation is None:
        return np.int32(NO_ACTIVATION), np.float32(0), np.float32(0)
    codes = activation_codes()
    if activation.kind not in codes:
        raise BackendError(
            f"GpuAcc applies the fused activations {', '.join(codes)} only; got {activation.kind}"
        )
    return (
        np.int32(activation_code(activation)),
        np.float32(activation.alpha),
        np.float32(activation.beta),
    )


def global_size(n: int) -> tuple[int]:
    """A 1-D global size covering ``n`` work-items in whole work-groups."""
    return (-(-n // LOCAL_SIZE) * LOCAL_SIZE,)


def ints(*values: int) -> list[np.int32]:
    return [np.int32(v) for v in values]


def fold_dims(sizes: Sequence[int], strides: Sequence[int]) -> list[tuple[int, int]]:
    """Dims read through element strides, as few runs as they make: (size, stride) of each,
    outermost first, a dim merged into the one before it where that one steps over it whole
    (dims of size 1 dropped; two dims of stride 0 merge too)."""
    runs: list[tuple[int, int]] = []
    for size, stride in zip(sizes, strides, strict=True):
        if size == 1:
            continue
        if runs and runs[-1][1] == stride * size:
            runs[-1] = (runs[-1][0] * size, stride)
        else:
            runs.append((size, stride))
    return runs


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    """The element strides of a row-major tensor of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return strides[::-1]


ROW_GROUP_MAX = 256  # reduction.cl's: the largest local size of its *_rows kernels
ROW_GROUP_MIN = 32  # rows shorter than this run one work-item each


def row_group(size: int, device: Any) -> int | None:
    """The local size of a row kernel (reduction.cl's ``*_rows``: one work-group per row of
    ``size`` values) on ``device``: a power of two near a quarter of the row, from
    ROW_GROUP_MIN to ROW_GROUP_MAX and within the device's work-group limit; None for rows
    shorter than ROW_GROUP_MIN, which the one-work-item-per-row kernels take. One work-item
    per row reads a transformer's 256-768-value rows serially: on an H200 a LayerNormalization
    of 1,576 such rows took 56 us, a work-group per row a tenth of that."""
    if size < ROW_GROUP_MIN:
        return None
    limit = min(ROW_GROUP_MAX, int(getattr(device, "max_work_group_size", ROW_GROUP_MAX)))
    group = ROW_GROUP_MIN
    while group * 2 <= min(limit, max(size // 4, 1)):
        group *= 2
    return group if group <= limit else None


def static_shape(info: TensorInfo | None) -> tuple[int, ...]:
    """The shape of ``info``, static in a layer GpuAcc takes (its layer support checks)."""
    if info is None:
        raise ShapeError("GpuAcc needs static shapes, got a tensor of no info")
    return static_dims(info.shape)


class GpuKernel:
    """The shared part of every GpuAcc kernel: its layer, device context, tuner and a lock.

    The lock serializes ``enqueue`` on one layer: a ``cl.Kernel`` holds its arguments, and
    two runs in flight may execute the same layer from two threads.
    """

    host_inputs: frozenset[int] = frozenset()
    fuses_activation = False
    is_view = False
    # Whether the kernel takes a float16 layer (reduce_fp32_to_fp16): its tensors stored as
    # half, its programs built with ``storage`` (common.cl's HALF_STORAGE), computing in float.
    half_storage = False

    def __init__(self, info: WorkloadInfo, context: Any, tuner: Tuner | None = None) -> None:
        self.info = info
        self.context = context
        self.tuner = tuner or Tuner()
        self.lock = threading.Lock()
        self.output_shapes = [static_shape(o) for o in info.outputs]

    @property
    def storage(self) -> str:
        """The build option of the layer's tensors' storage: `` -DHALF_STORAGE`` where they
        are float16, else nothing."""
        infos = [*self.info.inputs, *self.info.outputs]
        return " -DHALF_STORAGE" if any(i is not None and i.dtype is DataType.FLOAT16 for i in infos) else ""

    def launch(self, kernel: Any, queue: Any, n: int, *args: Any) -> Any:
        """Enqueue the 1-D ``kernel(*args)`` over ``n`` work-items on ``queue`` in work-groups
        of the tuned local size (see ``flowrt.workers.gpu.tuner``); returns the event."""
        return self.tuner.enqueue(kernel, queue, self.context.device, n, args)

    def launch_rows(self, kernel: Any, queue: Any, rows: int, group: int | None, *args: Any) -> Any:
        """Enqueue a row kernel (reduction.cl's ``*_rows``) over ``rows`` rows, one work-group of
        ``group`` work-items each (see :func:`row_group`); with ``group`` None, ``kernel`` is
        the one-work-item-per-row kind, launched as :meth:`launch` does. Returns the event."""
        if group is None:
            return self.launch(kernel, queue, rows, *args)
        return kernel(queue, (rows * group,), (group,), *args)

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        """Whether this kernel takes the layer (types and static shapes are checked before)."""
        return Support.yes()

    def prepare(self) -> None:
        """One-time work at load: build programs, make kernel objects, upload constants."""

    def enqueue(self, queue: Any, inputs: Sequence[Any], outputs: Sequence[GpuTensor]) -> Any:
        """Enqueue commands on ``queue`` that write ``outputs``; return the last one's event."""
        raise NotImplementedError

    def view(self, inputs: Sequence[Any]) -> list[GpuTensor]:
        """A view kernel's outputs (``is_view``): views of its input, no command."""
        raise NotImplementedError

    def constant(self, index: int) -> np.ndarray | None:
        """Input ``index``'s value when it is a constant of the model, else None."""
        constants = self.info.constants
        return constants[index] if index < len(constants) else None


GPU_KERNELS: dict[str, type[GpuKernel]] = {}


def gpu_kernel(*names: str) -> Callable[[type[GpuKernel]], type[GpuKernel]]:
    """Register the decorated class as the GpuAcc kernel of each named layer kind."""

    def register(cls: type[GpuKernel]) -> type[GpuKernel]:
        for name in names:
            if name in GPU_KERNELS:
                raise ValueError(f"GpuAcc kernel for {name!r} registered twice")
            GPU_KERNELS[name] = cls
        return cls

    return register


def load_all() -> dict[str, type[GpuKernel]]:
    """Import every kernel module (registering its kernels), once, and return the table."""
    import_kernel_modules(__name__)
    return GPU_KERNELS
