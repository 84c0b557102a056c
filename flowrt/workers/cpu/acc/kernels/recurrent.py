"""RNN, GRU and LSTM on CpuAcc: one native call per direction.

Per direction, the input projection of every time step is one GEMM (X (seq * batch, input)
by W^T); then a loop over the time steps multiplies the hidden state by R^T (one GEMM, or a
GEMV at batch 1) and runs the gate arithmetic row by row, each gate's activation one
vectorized loop over the row. Each step needs the one before, so the steps run in order on
the calling thread; where R is large (``PARALLEL_WEIGHTS``), the input projection and each
step's product by R are split into blocks of gate rows over the job's threads. A hidden size of 256 at batch 1 is a
1 MB GEMV per step: from one core's L2 and L3 it is most of the step's time, and two threads
each reading their half (which stays in that core's L2) take less than half of it.

Every array crosses into numba flat, 1-D and float32 (inputs read-only, outputs writable),
with the shapes in an int64 array, so that one compiled specialization serves every layer.
The semantics are CpuRef's (``flowrt/workers/cpu/ref/kernels/recurrent.py``).
"""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.recurrent import cell_activations, sequence_lengths
from flowrt.engine.scheduler.job import JobContext
from flowrt.errors import ShapeError
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import DataType
from flowrt.workers.cpu.acc.blas import pin_scipy_blas, read_only
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.acc.kernels.recurrent_steps import (
    CODES,
    GRU,
    KINDS,
    LSTM,
    RNN,
    compile_all,
    direction,
    product_address,
)

pin_scipy_blas()

GATES = {RNN: 1, GRU: 3, LSTM: 4}
# Fewest weights in R (floats, per direction) for which each step's product by R is split
# over the job's threads: below it a step's product takes a few microseconds, about what a
# parallel region costs.
PARALLEL_WEIGHTS = 1 << 17
_INPUT_NAMES = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")


def _flat(a) -> np.ndarray:
    """``a`` as a read-only, C-contiguous, 1-D float32 array (a view where it already is one)."""
    return read_only(np.ascontiguousarray(a, np.float32).reshape(-1))


@acc_kernel("RNN", "GRU", "LSTM")
class RecurrentKernel:
    """A recurrent layer, every direction, activation, clip, layout and optional input of the
    spec; absent optional inputs are zeros. Declines data other than float32."""

    # The products by W and R are split over as many threads as the job has now.
    takes_job = True

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        for i, t in enumerate(info.inputs):
            if i != 4 and t is not None and t.dtype is not DataType.FLOAT32:
                return Support.no(f"CpuAcc {info.kind} takes float32 only")
        return Support.yes()

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        desc = self.desc = info.descriptor
        self.kind = KINDS[info.kind]
        self.num_outputs = len(info.outputs)
        per_direction = [a for direction in cell_activations(desc) for a in direction]
        self.codes = np.array([CODES[a.name] for a in per_direction], np.int64)
        self.alphas = np.array([a.alpha for a in per_direction], np.float32)
        self.betas = np.array([a.beta for a in per_direction], np.float32)
        self.clip = np.float32(-1.0 if desc.clip is None else desc.clip)  # -1: no clip
        self.flag = getattr(desc, "input_forget", 0) or getattr(desc, "linear_before_reset", 0)
        self.reverse = [int(desc.direction == "reverse"), 1]
        constants = tuple(info.constants) + (None,) * 8
        self.constants = [None if c is None or i == 4 else _flat(c) for i, c in enumerate(constants[:8])]
        self._zeros: dict[int, np.ndarray] = {}
        self.workers = workers
        compile_all()
        self._product = product_address() if workers > 1 else 0

    def _zeros_of(self, size: int) -> np.ndarray:
        """Read-only zeros standing for an absent bias, peephole or initial state."""
        zeros = self._zeros.get(size)
        if zeros is None:
            zeros = self._zeros[size] = read_only(np.zeros(size, np.float32))
        return zeros

    def _operand(self, inputs, i: int, size: int) -> np.ndarray:
        """Input ``i`` flat (its prepared copy when constant; zeros when absent), checked to hold
        ``size`` values: numba does not check its bounds."""
        a = self.constants[i]
        if a is None:
            a = self._zeros_of(size) if inputs[i] is None else _flat(inputs[i])
        if a.size != size:
            raise ShapeError(
                f"{self.desc.op}: input {_INPUT_NAMES[i]} of {size} values expected, "
                f"got shape {np.shape(inputs[i])}"
            )
        return a

    def execute(self, inputs, outputs=None, job: JobContext | None = None):
        desc = self.desc
        inputs = list(inputs) + [None] * (8 - len(inputs))
        x_shape = np.shape(inputs[0])
        if len(x_shape) != 3 or np.ndim(inputs[2]) != 3:
            raise ShapeError(
                f"{desc.op}: X and R of rank 3 expected, got {x_shape} and {np.shape(inputs[2])}"
            )
        seq, batch = (x_shape[1], x_shape[0]) if desc.layout else (x_shape[0], x_shape[1])
        size, hidden, dirs = x_shape[2], np.shape(inputs[2])[2], desc.num_directions
        rows = GATES[self.kind] * hidden
        state = dirs * batch * hidden
        # X writable, as the states are: one sgemm specialization to compile
        x = np.ascontiguousarray(inputs[0], np.float32).reshape(-1)
        x = x if x.flags.writeable else x.copy()
        w, r = self._operand(inputs, 1, dirs * rows * size), self._operand(inputs, 2, dirs * rows * hidden)
        bias = self._operand(inputs, 3, dirs * 2 * rows)
        h0 = self._operand(inputs, 5, state)
        c0 = self._operand(inputs, 6, state)
        peep = self._operand(inputs, 7, dirs * 3 * hidden)
        lens = sequence_lengths(inputs[4], seq, batch, desc.op)
        y_shape = (batch, seq, dirs, hidden) if desc.layout else (seq, dirs, batch, hidden)
        state_shape = (batch, dirs, hidden) if desc.layout else (dirs, batch, hidden)
        given = list(outputs or [])
        results = [
            given[k] if k < len(given) else np.empty(shape, np.float32)
            for k, shape in enumerate((y_shape, state_shape, state_shape))
        ]
        dims = np.array([seq, batch, size, hidden, dirs, desc.layout, self.flag, *self.reverse], np.int64)
        y, y_h, y_c = (a.reshape(-1) for a in results)
        per = len(self.codes) // dirs
        threads = self.workers if job is None else min(self.workers, job.threads)
        tasks = np.int64(threads if self._product and rows * hidden >= PARALLEL_WEIGHTS else 1)
        for d in range(dirs):
            w_d, r_d = w.reshape(dirs, -1)[d], r.reshape(dirs, -1)[d]
            b_d, p_d = bias.reshape(dirs, -1)[d], peep.reshape(dirs, -1)[d]
            ours = slice(d * per, (d + 1) * per)
            codes, alphas, betas = self.codes[ours], self.alphas[ours], self.betas[ours]
            direction(
                self.kind,
                d,
                x,
                w_d,
                r_d,
                b_d,
                p_d,
                h0,
                c0,
                lens,
                y,
                y_h,
                y_c,
                dims,
                codes,
                alphas,
                betas,
                self.clip,
                np.int64(self._product),
                tasks,
            )
        return results[: self.num_outputs]
