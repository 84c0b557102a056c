"""Small CpuAcc workloads run as one native call: a tape of instructions that one numba
function walks, its operands bound once per memory pool.

A model of hundreds of small layers spends most of a run around its kernels, not in them:
each layer's Python call, argument checks and numba dispatch cost microseconds, its kernel
tens of nanoseconds. A memory pool's tensors never move, so once a pool is bound every
operand of a small elementwise layer is a fixed array: the layer becomes one row of an
``int64`` table (what to do, on which arrays, with which walk) and a run of such layers one
call of :func:`run_tape`, which dispatches on each row inside numba.

A workload is bound by :func:`bind` when its kernel has a binder here and its work fits one
slice (bigger work keeps its parallel region: the tape runs on the calling thread). The
executor asks each workload of a host segment (``AccWorkload.bind``), and merges consecutive
bound calls of one program (``BoundCall.program``) into one step: a tape is recorded as one
launch (``Tape.launch_rows``) which ``launches.replay`` runs in order with the recorded
layers around it, all in one call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import attrs
import numpy as np
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction, call_late, call_native, native_address
from flowrt.workers.cpu.acc.kernels.activation import ActivationKernel
from flowrt.workers.cpu.acc.kernels.concat import ConcatKernel
from flowrt.workers.cpu.acc.kernels.elementwise import ElementwiseKernel, _binary_rows
from flowrt.workers.cpu.acc.kernels.epilogue import ACTIVATE_SLICE, ACTIVATE_SLICE_NAME
from flowrt.workers.cpu.acc.kernels.reshape import ViewKernel
from flowrt.workers.cpu.acc.launches import LAUNCHES, recording

# Instruction kinds, and the columns of an instruction row: each operand is an address and a
# length in float32 elements.
ACTIVATION, BINARY = 0, 1
KIND, OUT, OUT_N, A, A_N, B, B_N, WALK, DIMS, INNER, A_STEP, B_STEP, OP, CODE, ROWS = range(15)


@intrinsic
def _as_pointer(typingctx, address):
    """An int64 address as a ``void*``, for ``carray``."""

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(types.int64), codegen


@njit(inline="always", nogil=True, cache=True)
def _operand(row, at):
    # A typed list of arrays costs about 110 ns a read (reference counting and checks), more
    # than a small layer's work: operands are addresses, kept alive by the Tape's owner.
    return carray(_as_pointer(row[at]), row[at + 1], np.float32)


@njit(nogil=True, cache=True, error_model="numpy")
def run_tape(rows, walks, params):
    """Run every instruction of ``rows`` in order; ``walks`` holds the outer shapes and
    strides of the binary walks, ``params`` each row's activation (alpha, beta)."""
    for i in range(rows.shape[0]):
        row = rows[i]
        out, a = _operand(row, OUT), _operand(row, A)
        alpha, beta = params[i, 0], params[i, 1]
        if row[KIND] == ACTIVATION:
            # through its slot: linked in, it cost every tape 1.8 s to compile on a cold
            # cache, for models whose activations are all fused into their producers
            call_late(ACTIVATE_SLICE_NAME, (out, a, row[CODE], alpha, beta))
        else:
            at, dims = row[WALK], row[DIMS]
            _binary_rows(
                a, walks[at + dims : at + 2 * dims], row[A_STEP],
                _operand(row, B), walks[at + 2 * dims : at + 3 * dims], row[B_STEP],
                out, walks[at : at + dims], row[INNER], 0, row[ROWS], row[OP], row[CODE], alpha, beta,
            )  # fmt: skip


@attrs.frozen(eq=False)
class Instruction:
    """One bound layer: its row (array slots are indices into ``operands``), the walk's
    int64 data, its activation parameters and the arrays it reads and writes."""

    row: tuple[int, ...]
    walk: tuple[int, ...]
    params: tuple[float, float]
    operands: tuple[np.ndarray, ...]


@njit(**NATIVE)
def _tape_slice(task, step, tape, rows, walks, params):
    """A tape as the one task of a launch (a :class:`SliceFunction`): :func:`run_tape`, called
    by its address ``tape``, so that this holds a call, not a second copy of the tape's code."""
    call_native(tape, (rows, walks, params))


TAPE_SLICE = SliceFunction(_tape_slice)


@functools.cache
def _tape_address() -> int:
    """The address of :func:`run_tape`, which :data:`TAPE_SLICE` calls."""
    return native_address(run_tape, _TAPE_SIGNATURE)


class Tape:
    """Compiles consecutive bound calls into one call of :func:`run_tape`, or records that call
    as a launch (:meth:`launch_rows`), which ``launches.replay`` runs with recorded layers."""

    @staticmethod
    def compile(calls: Sequence[BoundCall]) -> Callable[[], None]:
        tables = Tape._tables(calls)
        if tables is None:
            return lambda: None
        table, flat_walks, table_params, keep = tables

        def run() -> None:
            run_tape(table, flat_walks, table_params)

        run.keep = keep  # type: ignore[attr-defined]  # held by the call, as long as it lives
        return run

    @staticmethod
    def launch_rows(calls: Sequence[BoundCall]) -> tuple[np.ndarray, list[Any]]:
        """The rows of ``launches.replay`` that run ``calls`` (one launch of the whole tape; none
        where no call has an instruction), and what must live as long as they are used."""
        tables = Tape._tables(calls)
        if tables is None:
            return np.zeros((0, 4), np.int64), []
        args = (np.int64(_tape_address()), *tables[:3])
        with recording() as recorder:
            TAPE_SLICE.run(1, args)
        assert not recorder.failed  # three arrays fit a record many times over
        rows, records = recorder.table()
        return rows, [records, recorder.keep, tables[3]]

    @staticmethod
    def _tables(calls: Sequence[BoundCall]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Any]] | None:
        """``run_tape``'s arguments for ``calls``, and the operands whose addresses they hold;
        None where no call has an instruction."""
        rows: list[list[int]] = []
        walks: list[tuple[int, ...]] = []
        params: list[tuple[float, float]] = []
        keep = []  # the operands' memory lives as long as the tape that holds their addresses
        for call in calls:
            instruction = call.instruction
            if instruction is None:
                continue
            keep.append(instruction.operands)
            row = list(instruction.row)
            for column, x in zip((OUT, A, B), instruction.operands):
                row[column], row[column + 1] = x.ctypes.data, x.size
            row[WALK] = sum(len(w) for w in walks)
            rows.append(row)
            walks.append(instruction.walk)
            params.append(instruction.params)
        if not rows:
            return None
        table = np.array(rows, np.int64)
        flat_walks = np.array([v for w in walks for v in w] or [0], np.int64)
        return table, flat_walks, np.array(params, np.float32), keep


@attrs.frozen(eq=False)
class BoundCall:
    """What ``AccWorkload.bind`` returns: the layer's output arrays (fixed for the pool) and
    its instruction (None: nothing to run, a view of its input). ``program`` merges
    consecutive bound calls, and recorded layers around them, into one step."""

    outputs: tuple[np.ndarray, ...]
    instruction: Instruction | None
    program: ClassVar[Any] = LAUNCHES

    @staticmethod
    def replay_rows(
        calls: Sequence[BoundCall],
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[Any]]:
        """``launches.Launches.compile``'s rows for consecutive bound calls (the same for
        every thread count: a tape runs on the calling thread)."""
        rows, keep = Tape.launch_rows(calls)
        return [rows], [rows], [rows], keep


def _call(outputs: Sequence[np.ndarray], instruction: Instruction | None) -> BoundCall:
    return BoundCall(tuple(outputs), instruction)


def _flat(x: np.ndarray | None) -> np.ndarray | None:
    """``x`` as a flat float32 C-contiguous view, or None when it cannot be one without a copy."""
    if x is None or x.dtype != np.float32 or not x.flags.c_contiguous:
        return None
    return x.reshape(-1)


def _bind_binary(kernel: ElementwiseKernel, inputs, outputs) -> BoundCall | None:
    if len(inputs) != 2 or kernel.legacy or outputs[0] is None:
        return None
    a, b, out = inputs[0], inputs[1], outputs[0]
    flat = [x for x in (_flat(a), _flat(b), _flat(out)) if x is not None]
    if len(flat) < 3 or out.size == 0:
        return None
    if np.broadcast_shapes(a.shape, b.shape) != out.shape:
        return None
    walk = kernel.walk(a.shape, b.shape, out.shape)
    if walk.bounds.shape[0] != 2:  # work for more than one thread keeps its parallel region
        return None
    code, alpha, beta = kernel.activation
    row = [
        BINARY,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        len(walk.outer),
        walk.inner,
        walk.a_step,
        walk.b_step,
        kernel.op,
        code,
    ]
    row.append(int(walk.bounds[1]))
    walk_data = tuple(int(v) for v in (*walk.outer, *walk.a_strides, *walk.b_strides))
    operands = (flat[2], flat[0], flat[1])
    return _call([out], Instruction(tuple(row), walk_data, (float(alpha), float(beta)), operands))


def _bind_activation(kernel: ActivationKernel, inputs, outputs) -> BoundCall | None:
    x, out = inputs[0], outputs[0]
    flat_x, flat_out = _flat(x), _flat(out)
    if flat_x is None or flat_out is None or x.shape != out.shape or getattr(kernel, "run_time_bounds", ()):
        return None
    if kernel.bounds(flat_x.size).shape[0] != 2:
        return None
    row = (ACTIVATION, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, kernel.code, 0)
    ACTIVATE_SLICE.address()  # compiled now, at load, not in the first run
    operands = (flat_out, flat_x, flat_x)
    return _call([out], Instruction(row, (), (float(kernel.alpha), float(kernel.beta)), operands))


def _bind_view(kernel: ViewKernel, inputs, outputs) -> BoundCall | None:
    x = inputs[0]
    if kernel.out_shape is None or x is None or x.shape != kernel.in_shape or not x.flags.c_contiguous:
        return None
    return _call([x.reshape(kernel.out_shape)], None)


def _bind_concat(kernel: ConcatKernel, inputs, outputs) -> BoundCall | None:
    """Nothing to run where every input is written in place by its producer (a sub-tensor of
    the output, as the memory planner places Concat parts); else None: its copies are
    recorded as launches."""
    out = outputs[0]
    if out is None or any(x is None for x in inputs) or not kernel.in_place(inputs, out):
        return None
    return _call([out], None)


# The kernels whose bound calls a tape runs (or passes over, views): preparing one compiles
# the tape. A Concat's bound call has nothing to run.
TAPE_KERNELS = frozenset({ElementwiseKernel, ActivationKernel, ViewKernel})
BINDERS: dict[type, Callable[..., BoundCall | None]] = {
    ElementwiseKernel: _bind_binary,
    ActivationKernel: _bind_activation,
    ViewKernel: _bind_view,
    ConcatKernel: _bind_concat,
}


_TAPE_SIGNATURE = (types.int64[:, ::1], types.int64[::1], types.float32[:, ::1])


def warm_up(kernel: Any) -> None:
    """Compile :func:`run_tape` (or load it from numba's cache) when ``kernel`` may join a
    tape, so that it happens at load, under the load's progress bar, not in the first run
    (on an empty cache, 20 s). Its one signature serves every tape; once per process."""
    if type(kernel) in TAPE_KERNELS and _TAPE_SIGNATURE not in run_tape.overloads:
        run_tape.compile(_TAPE_SIGNATURE)
        # and its launch, which a pool's program replays with recorded layers
        empty = np.zeros((0, ROWS + 1), np.int64)
        args = (np.int64(0), empty, np.zeros(1, np.int64), np.zeros((0, 2), np.float32))
        with recording():
            TAPE_SLICE.run(1, args)


def bind(
    kernel: Any, inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray | None]
) -> BoundCall | None:
    """``kernel``'s work on these fixed arrays as a tape instruction, or None when it has no
    binder or its work does not fit one (see the module doc)."""
    binder = BINDERS.get(type(kernel))
    return None if binder is None else binder(kernel, inputs, outputs)
