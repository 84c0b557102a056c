"""Gemm on gemm.cl's tiled GEMM; :class:`Gemm`, one planned GEMM shape, serves Conv and MatMul too."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from flowrt.registry import FusedActivation
from flowrt.workers.gpu.device import cl
from flowrt.workers.gpu.kernels import GpuKernel, activation_args, gpu_kernel, ints, static_shape
from flowrt.workers.gpu.tensor import GpuTensor

logger = logging.getLogger(__name__)


@attrs.frozen
class Operand:
    """A matrix read through strides: element (r, c) is ``tensor[r * rows + c * cols]`` (of
    its bytes, flat); ``step`` is how far apart consecutive batches (or groups, for A and the
    bias) lie, or, with ``heads`` > 1 (A and B only), consecutive runs of ``heads`` batches,
    the batches within a run ``head_step`` apart."""

    tensor: GpuTensor
    rows: int
    cols: int
    step: int = 0
    heads: int = 1
    head_step: int = 0


@attrs.frozen
class Tiling:
    """A build of gemm.cl: ``rows`` x ``cols`` tiles of C per work-group, each work-item a
    ``item_rows`` x ``item_cols`` block of it (``blocked``: consecutive rows and columns, read
    from local memory as vectors; else rows and columns 16 apart). ``resident`` work-groups of
    it fit on one compute unit at once, and ``efficiency`` is the share of the unit's peak
    they reach (a larger block per work-item reuses each staged value more);
    :func:`plan_gemm` weighs both."""

    rows: int
    cols: int
    item_rows: int
    item_cols: int
    resident: int
    efficiency: float
    blocked: bool = False
    depth: int = 16  # the K slice staged in local memory at a time (gemm.cl's TK)
    # On the tensor cores (gemm.cl's MMA build): ``item_rows`` x ``item_cols`` is then one
    # warp's block of m16n8k16 products, and a work-group is one warp per block of the tile.
    mma: bool = False

    @property
    def name(self) -> str:
        return f"{self.rows}x{self.cols}"

    @property
    def defines(self) -> str:
        if self.mma:
            warps = f"-DWARPS_M={self.rows // self.item_rows} -DWARPS_N={self.cols // self.item_cols}"
            return f"-DMMA {warps} -DFRAG_M={self.item_rows // 16} -DFRAG_N={self.item_cols // 8} -DTK={self.depth}"
        blocked = " -DBLOCKED" if self.blocked else ""
        sizes = f"-DTM={self.rows} -DTN={self.cols} -DWPTM={self.item_rows} -DWPTN={self.item_cols} -DTK={self.depth}"
        return sizes + blocked

    @property
    def local_size(self) -> tuple[int, int, int]:
        if self.mma:
            return (32 * (self.rows // self.item_rows) * (self.cols // self.item_cols), 1, 1)
        return (self.cols // self.item_cols, self.rows // self.item_rows, 1)


# gemm.cl's builds. Their residency and efficiency are fitted to device timings of 48 GEMM
# shapes (the convolutions and matrix products of resnet50, densenet121 and a BERT-base layer,
# batch 1 and 8) on an H100: the plan they give is within 1% of the best of every tiling and
# split there, in all, and 3x faster than one 64 x 64 tiling alone at batch 1. Blocked reads
# made the 64 x 64 and 32 x 32 tilings 18-19% faster and the 128 x 64 one 3% slower; 64 x 128
# and 128 x 128 tilings were never the best. The 64 x 64 tiling's 128 work-items of 8 x 4
# (16 deep slices) took over from 256 of 4 x 4 (8 deep) on an H200: every resnet50 conv of
# batch 8 took 3.76 ms of device time in the plans the model gives against 3.99 (the best of
# either set: 3.73 and 3.86), batch 1 1.27 against 1.26; 8 x 8 blocks, and 4 x 8, were slower.
TILINGS = {
    t.name: t
    for t in (
        Tiling(128, 64, 8, 4, resident=2, efficiency=0.93),
        Tiling(64, 64, 8, 4, resident=4, efficiency=1.1, blocked=True),
        Tiling(32, 32, 2, 2, resident=4, efficiency=0.44, blocked=True),
    )
}
# The tensor cores' builds, for half operands on a device that has them (has_tensor_cores):
# warps of 32 x 32 blocks of C, two to sixteen warps a work-group. Their residency and
# efficiency (in the FMA tilings' unit) are fitted to device timings of resnet50's
# convolutions at batch 1 and 8 on an H200, every tiling and split of 1, 2, 4 and 8: the
# plans they give take 2.58 and 1.26 ms in all, against 2.49 and 1.25 for the best of each
# shape (the FMA builds' best: 3.89 and 1.48). Loading the slices, not multiplying them,
# bounds these kernels (20-37 TFLOP/s at batch 8), so larger tiles, which load less per
# product, pay where there are enough of them.
MMA_TILINGS = {
    t.name: t
    for t in (
        Tiling(128, 128, 32, 32, resident=1, efficiency=1.5, depth=32, mma=True),
        Tiling(128, 64, 32, 32, resident=2, efficiency=0.9, depth=32, mma=True),
        Tiling(64, 64, 32, 32, resident=2, efficiency=0.8, depth=32, mma=True),
        Tiling(32, 64, 32, 32, resident=4, efficiency=0.8, depth=32, mma=True),
    )
}
TK = 16  # a K split's slices are whole steps of this many (every FMA tiling's depth divides it)
_SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)
# A split-K reduction's fixed cost (its launch) and its cost per float read, in the unit of
# _cost: cycles of one compute unit. The launch is priced at what the host pays to enqueue one
# (about 15 us on an H100, where a batch-1 run is bound by its launches): timed whole, resnet50
# at batch 1 ran 1.7-1.8 ms against 2.2-2.5 with the device's own 5 us, batch 8 the same.
_REDUCE_LAUNCH, _REDUCE_PER_FLOAT = 25000, 1.0


@attrs.frozen
class GemmPlan:
    """How one GEMM shape runs: its tiling and K cut into ``splits`` slices of ``k_split``."""

    tiling: Tiling
    splits: int
    k_split: int


def _cost(m: int, n: int, k: int, batches: int, units: int, tiling: Tiling, splits: int) -> float:
    """Cycles of one compute unit (at 128 multiply-adds a cycle) the GEMM takes: whole waves
    of ``resident`` work-groups per unit, plus the reduction when K is split."""
    tiles = -(-m // tiling.rows) * -(-n // tiling.cols) * batches * splits
    waves = -(-tiles // (units * tiling.resident))
    depth = -(-k // splits)
    cycles = waves * tiling.resident * tiling.rows * tiling.cols * depth / (128 * tiling.efficiency)
    if splits > 1:
        cycles += transfer_cost(splits * m * n * batches, units)
    return cycles


def ranked_plans(
    shape: tuple[int, int, int],
    batches: int,
    units: int,
    tilings: dict[str, Tiling] = TILINGS,
    whole_k: bool = False,
) -> list[GemmPlan]:
    """Every tiling and K split of an (M, N, K) GEMM of ``batches`` batches, cheapest first on
    a device of ``units`` compute units by :func:`_cost`: large tiles where there are enough
    of them to fill the device, smaller ones or a split K where there are not (a batch-1
    convolution of a deep layer has a few dozen pixels and thousands of K). ``whole_k``: no
    split (a C written through strides)."""
    return [c[2] for c in sorted(_candidates(shape, batches, units, tilings, whole_k), key=lambda c: c[:2])]


def least_cost(
    shape: tuple[int, int, int], batches: int, units: int, tilings: dict[str, Tiling] = TILINGS
) -> float:
    """What :func:`_cost` says the cheapest plan of such a GEMM takes (to weigh algorithms)."""
    return min(c[0] for c in _candidates(shape, batches, units, tilings, False))


def transfer_cost(floats: int, units: int, per_float: float = _REDUCE_PER_FLOAT) -> float:
    """What a kernel that moves ``floats`` values costs, in :func:`_cost`'s unit: its launch
    and ``per_float`` a value per unit (a split K's reduction's price by default)."""
    return _REDUCE_LAUNCH + per_float * floats / units


def _candidates(
    shape: tuple[int, int, int], batches: int, units: int, tilings: dict[str, Tiling], whole_k: bool
) -> list[tuple[float, int, GemmPlan]]:
    """(cost, tiling's rank, plan) of every tiling and split that fits."""
    m, n, k = shape
    candidates = []
    for index, tiling in enumerate(tilings.values()):
        for splits in (1,) if whole_k else _SPLITS:
            plan = _plan(tiling, splits, k)
            if plan is not None and (splits == 1 or k >= splits * 8 * TK):
                candidates.append((_cost(m, n, k, batches, units, tiling, splits), index, plan))
    return candidates


def _plan(tiling: Tiling, splits: int, k: int) -> GemmPlan | None:
    """K in ``splits`` slices of whole TK steps, or None when that many do not fit K."""
    k_split = -(-k // splits // TK) * TK
    return GemmPlan(tiling, splits, k_split) if splits == 1 or -(-k // k_split) == splits else None


# A CPU OpenCL device (PoCL's) runs a work-group as a loop on one core: the tilings run alike
# there and a split K only adds a pass, so it takes one tiling, whole (and compiles one).
CPU_TILING = "64x64"


def plan_gemm(
    shape: tuple[int, int, int],
    batches: int,
    units: int,
    cpu: bool = False,
    tilings: dict[str, Tiling] = TILINGS,
    whole_k: bool = False,
) -> GemmPlan:
    """The plan :func:`ranked_plans` ranks first among ``tilings``; on a CPU device, its
    CPU_TILING with K whole."""
    if cpu:
        whole = _plan(tilings[CPU_TILING], 1, shape[2])
        assert whole is not None  # one split always fits
        return whole
    return ranked_plans(shape, batches, units, tilings, whole_k)[0]


class Gemm:
    """One GEMM shape of a layer, planned for its device: the kernels of the chosen tiling (and
    the split-K reduction when K is split). ``enqueue`` runs
    ``C[n] = act(alpha * A[n % groups] @ B[n] + beta * bias[n % groups])`` for each of the
    ``batches`` batches (C packed, (M, N) per batch).

    The plan is the tuner's, where it has timed one for this shape and device (its first
    enqueue on the tuner's profiling queue times the plans :func:`ranked_plans` ranks first),
    else the cost model's.

    With ``image`` (a convolution's (H, W, KH, KW, OW, SH, SW, PH, PW, DH, DW)), B is the
    convolution's column matrix read from the image itself (gemm.cl's IMPLICIT build): B's
    operand is the image, its ``step`` one group's channels, its strides unused.

    With ``head_steps``, operands' batches may step at two levels (``Operand.heads``; gemm.cl's
    HEAD_STEPS build); without, their ``heads`` must be 1.

    With ``strided_c``, ``enqueue`` writes C through the strides of an ``Operand`` (gemm.cl's
    C_STRIDES build; K whole, no residual); without, C is packed.

    A layer stored as half on a device with tensor cores (``DeviceContext.tensor_cores``)
    plans among MMA_TILINGS, gemm.cl's MMA builds, and tunes under its own name."""

    def __init__(
        self,
        owner: GpuKernel,
        shape: tuple[int, int, int],
        batches: int = 1,
        image: tuple[int, ...] | None = None,
        head_steps: bool = False,
        strided_c: bool = False,
    ) -> None:
        self.owner = owner
        self.head_steps = head_steps  # operands' batches at two levels (gemm.cl's HEAD_STEPS)
        self.strided_c = strided_c  # C written through strides (gemm.cl's C_STRIDES)
        self.shape = shape
        self.batches = batches
        self.image = ints(*(image or (0,) * 11))
        self.implicit = image is not None
        # Half operands go to the tensor cores where the device has them.
        self.mma = bool(owner.storage) and owner.context.tensor_cores
        self.tilings = MMA_TILINGS if self.mma else TILINGS
        self.name = ("gemm_implicit" if image else "gemm") + ("_mma" if self.mma else "")
        self.name += "_strided_c" if strided_c else ""
        self.device = owner.context.device
        tuned = owner.tuner.plan(self.device, self.name, (*shape, batches))
        plan = self._tuned_plan(tuned) if tuned is not None else None
        self.tuned = plan is not None
        self.cpu = bool(self.device.type & cl.device_type.CPU)
        self.plan = plan or plan_gemm(
            shape,
            batches,
            int(self.device.max_compute_units),
            self.cpu,
            tilings=self.tilings,
            whole_k=strided_c,
        )
        self.kernel, self.reduce = self._kernels(self.plan)

    def _tuned_plan(self, tuned: tuple[int, ...]) -> GemmPlan | None:
        """The tuning file's (tile rows, tile columns, splits) as a plan; None, logged, when
        it names no tiling of this version or a split K does not take."""
        tiling = self.tilings.get(f"{tuned[0]}x{tuned[1]}") if len(tuned) == 3 else None
        # (rows, cols, splits), K whole for a strided C
        splits_ok = tiling is not None and (tuned[2] == 1 or (tuned[2] > 1 and not self.strided_c))
        plan = _plan(tiling, tuned[2], self.shape[2]) if tiling is not None and splits_ok else None
        if plan is None:
            logger.warning(
                "ignoring the tuned plan %s of %s %s: no such tiling and split", tuned, self.name, self.shape
            )
        return plan

    def _kernels(self, plan: GemmPlan) -> tuple[Any, Any]:
        storage = self.owner.storage
        defines = plan.tiling.defines + storage + (" -DHEAD_STEPS" if self.head_steps else "")
        defines += " -DC_STRIDES" if self.strided_c else ""
        if self.implicit:  # the kernel window built in (image holds H, W, KH, KW, ...)
            defines += f" -DIMPLICIT -DWINDOW_H={self.image[2]} -DWINDOW_W={self.image[3]}"
        if self.mma and not self.cpu:  # a CPU device computes the warps' products without them
            defines += " -DTENSOR_CORES"
        if plan.splits > 1 and storage:  # the partial products stay float (gemm.cl's PARTIAL_FLOAT)
            defines += " -DPARTIAL_FLOAT"
        kernel = self.owner.context.kernel("gemm", "gemm", defines)
        reduce = self.owner.context.kernel("gemm_reduce", "gemm_reduce", storage) if plan.splits > 1 else None
        return kernel, reduce

    def enqueue(
        self,
        queue: Any,
        a: Operand,
        b: Operand,
        c: GpuTensor,
        bias: Operand | None = None,
        *,
        groups: int = 1,
        alpha: float = 1.0,
        beta: float = 1.0,
        activation: FusedActivation | None = None,
        residual: GpuTensor | None = None,
        c_write: Operand | None = None,
    ) -> Any:
        """Enqueue the GEMM on ``queue``; returns the event of its last command. A
        ``residual`` (laid out as C) is added before the activation. ``c_write`` (its tensor
        ``c``): where a ``strided_c`` GEMM writes each element of C, else C is packed."""
        assert (c_write is not None) == self.strided_c and (residual is None or not self.strided_c)
        has_bias = bias is not None
        bias = bias or Operand(c, 0, 0)  # a placeholder the kernel never reads
        epilogue = (
            *bias.tensor.kernel_args, *ints(has_bias, bias.step, bias.rows, bias.cols),
            *(residual or c).kernel_args, np.int32(residual is not None),
            np.float32(alpha), np.float32(beta), *activation_args(activation),
        )  # fmt: skip
        operands = (a, b, c, groups, epilogue, c_write)
        if not self.tuned and self.owner.tuner.tunes_on(queue):
            self._tune(queue, operands)
        return self._enqueue(self.plan, self.kernel, self.reduce, queue, *operands)[-1]

    def _tune(self, queue: Any, operands: tuple) -> None:
        """Time the plans ranked first on ``queue`` (the tuner's) and take the fastest."""

        kernels: dict[GemmPlan, tuple[Any, Any]] = {}  # built for the candidates timed only

        def runner(plan: GemmPlan) -> Callable[[], list[Any]]:
            def run() -> list[Any]:
                if plan not in kernels:
                    kernels[plan] = self._kernels(plan)
                return self._enqueue(plan, *kernels[plan], queue, *operands)

            return run

        ranked = ranked_plans(
            self.shape, self.batches, int(self.device.max_compute_units), self.tilings, self.strided_c
        )
        if self.cpu:  # one tiling there (see CPU_TILING): its splits only
            ranked = [p for p in ranked if p.tiling.name == CPU_TILING]
        by_key: dict[tuple[int, ...], GemmPlan] = {
            (p.tiling.rows, p.tiling.cols, p.splits): p for p in ranked
        }
        chosen = self.owner.tuner.choose(
            self.device,
            self.name,
            (*self.shape, self.batches),
            [(key, runner(p)) for key, p in by_key.items()],
        )
        self.plan, self.tuned = by_key[chosen], True
        self.kernel, self.reduce = kernels[self.plan]

    def _enqueue(
        self, plan: GemmPlan, kernel: Any, reduce: Any, queue: Any, a: Operand, b: Operand, c: GpuTensor,
        groups: int, epilogue: tuple, c_write: Operand | None,
    ) -> list[Any]:  # fmt: skip
        m, n, k = self.shape
        tiling, splits = plan.tiling, plan.splits
        rn, rm, _ = tiling.local_size
        size = (-(-n // tiling.cols) * rn, -(-m // tiling.rows) * rm, self.batches * splits)
        partial = c if splits == 1 else self.owner.context.scratch((self.batches * splits * m * n,))
        write = c_write or Operand(partial, n, 1, m * n)  # packed, (M, N) a batch
        events = [
            kernel(
                queue, size, tiling.local_size,
                *ints(m, n, k, groups, splits, plan.k_split),
                *a.tensor.kernel_args, *ints(a.step, a.heads, a.head_step, a.rows, a.cols),
                *b.tensor.kernel_args, *ints(b.step, b.heads, b.head_step, b.rows, b.cols), *self.image,
                *partial.kernel_args, *ints(write.step, write.heads, write.head_step, write.rows, write.cols),
                *epilogue,
            )
        ]  # fmt: skip
        if reduce is not None:
            total = self.batches * m * n
            events.append(
                self.owner.launch(
                    reduce, queue, total, *ints(m, n, groups, splits, total),
                    *partial.kernel_args, *c.kernel_args, np.int32(m * n), *epilogue,
                )
            )  # fmt: skip
        return events


def matrix(tensor: GpuTensor, transposed: bool) -> Operand:
    """A row-major 2-D tensor as an operand, read transposed when asked."""
    cols = tensor.shape[1]
    return Operand(tensor, 1, cols) if transposed else Operand(tensor, cols, 1)


def bias_operand(c: GpuTensor) -> Operand:
    """Gemm's C broadcast to the (M, N) product: stride 0 along its size-1 or missing dims."""
    shape = (1,) * (2 - len(c.shape)) + c.shape
    rows = shape[1] if shape[0] != 1 else 0
    return Operand(c, rows, 1 if shape[1] != 1 else 0)


@gpu_kernel("Gemm")
class GemmKernel(GpuKernel):
    """Y = act(alpha * A' @ B' + beta * C)."""

    fuses_activation = True
    half_storage = True

    def prepare(self) -> None:
        (m, n) = self.output_shapes[0]
        a = static_shape(self.info.inputs[0])
        k = a[0] if self.info.descriptor.transA else a[1]
        self.gemm = Gemm(self, (m, n, k))

    def enqueue(self, queue: Any, inputs: Sequence[GpuTensor | None], outputs: Sequence[GpuTensor]) -> Any:
        a, b, *rest = inputs
        assert a is not None and b is not None  # required inputs; only C is optional
        desc = self.info.descriptor
        c = rest[0] if rest and desc.beta != 0 else None
        bias = bias_operand(c) if c is not None else None
        return self.gemm.enqueue(
            queue, matrix(a, desc.transA), matrix(b, desc.transB), outputs[0], bias,
            alpha=desc.alpha, beta=desc.beta, activation=self.info.activation,
        )  # fmt: skip
