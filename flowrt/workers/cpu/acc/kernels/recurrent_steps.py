"""The numba side of CpuAcc's recurrent layers (``recurrent.py``): the time loop of RNN, GRU
and LSTM, their gate arithmetic, and the cell activations the spec lists.

:func:`direction` runs one direction of a layer. It takes every array flat and 1-D, and the
shapes in ``dims``:
``(seq, batch, input, hidden, directions, layout, flag, reverse of direction 0, of 1)``,
``flag`` being LSTM's ``input_forget`` or GRU's ``linear_before_reset``. A row of the input
projection, of Y and of a state is found by :func:`_x_row`, :func:`_y_at` and
:func:`_state_at`, which know both layouts.

The functions call one another through slots (``calls.LateFunction``), each compiled once on
its own: called directly, numba links each callee's code into its caller and optimizes it
again there, level after level, and inlined its IR is copied at every call site; either way
a cold cache took 10-13 s to compile the layer, against about 5 s so.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types

from flowrt.workers.cpu.acc import calls
from flowrt.workers.cpu.acc.blas import sgemm
from flowrt.workers.cpu.acc.calls import (
    NATIVE,
    LateFunction,
    SliceFunction,
    borrowed,
    call_late,
    run_stages_native,
)
from flowrt.workers.cpu.acc.kernels import epilogue as ep

RNN, GRU, LSTM = range(3)
KINDS = {"RNN": RNN, "GRU": GRU, "LSTM": LSTM}
(SIGMOID, TANH, RELU, SOFTSIGN, SOFTPLUS, LEAKY_RELU, THRESHOLDED_RELU, ELU, HARD_SIGMOID, AFFINE,
 SCALED_TANH) = range(11)  # fmt: skip
CODES = {
    "Sigmoid": SIGMOID, "Tanh": TANH, "Relu": RELU, "Softsign": SOFTSIGN, "Softplus": SOFTPLUS,
    "LeakyRelu": LEAKY_RELU, "ThresholdedRelu": THRESHOLDED_RELU, "Elu": ELU,
    "HardSigmoid": HARD_SIGMOID, "Affine": AFFINE, "ScaledTanh": SCALED_TANH,
}  # fmt: skip

_I8, _F4 = types.int64, types.float32
_F1, _F2, _I1 = (types.Array(types.float32, 1, "C"), types.Array(types.float32, 2, "C"),
                 types.Array(types.int64, 1, "C"))  # fmt: skip
_F1R = types.Array(types.float32, 1, "C", readonly=True)


# error_model="numpy": no division-by-zero check, which would keep the loops from vectorizing.
@njit(nogil=True, cache=True, error_model="numpy")
def gate(row, code, alpha, beta, clip):
    """``row = activation(clip(row))`` in place (``clip`` < 0: none), one loop per activation
    (each vectorizes)."""
    n = row.shape[0]
    if clip >= 0:
        for j in range(n):
            row[j] = min(max(row[j], -clip), clip)
    if code == SIGMOID:
        for j in range(n):
            row[j] = ep.sigmoid(row[j], alpha, beta)
    elif code == TANH:
        for j in range(n):
            row[j] = ep.tanh(row[j], alpha, beta)
    elif code == RELU:
        for j in range(n):
            row[j] = ep.relu(row[j], alpha, beta)
    elif code == SOFTSIGN:
        for j in range(n):
            row[j] = row[j] / (np.float32(1) + abs(row[j]))
    elif code == SOFTPLUS:
        for j in range(n):
            row[j] = ep.softplus(row[j], alpha, beta)
    elif code == LEAKY_RELU:
        for j in range(n):
            row[j] = ep.leaky_relu(row[j], alpha, beta)
    elif code == THRESHOLDED_RELU:
        for j in range(n):
            row[j] = row[j] if row[j] > alpha else np.float32(0)
    elif code == ELU:
        for j in range(n):
            row[j] = ep.elu(row[j], alpha, beta)
    elif code == HARD_SIGMOID:
        for j in range(n):
            row[j] = ep.hard_sigmoid(row[j], alpha, beta)
    elif code == AFFINE:
        for j in range(n):
            row[j] = row[j] * alpha + beta
    else:  # SCALED_TANH
        for j in range(n):
            row[j] = ep.tanh(row[j] * beta, alpha, beta) * alpha


_GATE_SLOT = "flowrt_recurrent_gate"
GATE = LateFunction(gate, (_F1, _I8, _F4, _F4, _F4), _GATE_SLOT)


@njit(nogil=True, cache=True)
def _x_row(t, b, dims):
    return b * dims[0] + t if dims[5] else t * dims[1] + b


@njit(nogil=True, cache=True)
def _y_at(t, d, b, dims):
    seq, batch, hidden, dirs = dims[0], dims[1], dims[3], dims[4]
    return ((b * seq + t) * dirs + d) * hidden if dims[5] else ((t * dirs + d) * batch + b) * hidden


@njit(nogil=True, cache=True)
def _state_at(d, b, dims):
    batch, hidden, dirs = dims[1], dims[3], dims[4]
    return (b * dirs + d) * hidden if dims[5] else (d * batch + b) * hidden


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def _rnn_cells(s, d, reverse, xw, hp, h, bsum, lens, y, dims, acts, alphas, betas, clip, pre):
    """One time step of an RNN, every batch entry still running."""
    for b in range(dims[1]):
        if s < lens[b]:
            t = lens[b] - 1 - s if reverse else s
            row, recurrent = xw[_x_row(t, b, dims)], hp[b]
            for j in range(pre.shape[0]):
                pre[j] = row[j] + recurrent[j] + bsum[j]
            call_late(_GATE_SLOT, (pre, acts[0], alphas[0], betas[0], clip))
            at, out = _y_at(t, d, b, dims), h[b]
            for j in range(pre.shape[0]):
                out[j] = pre[j]
                y[at + j] = pre[j]


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def _lstm_cells(s, d, reverse, xw, hp, h, c, bsum, peep, lens, y, dims, acts, alphas, betas, clip, pre, cell):
    """One time step of an LSTM (gates i, o, f, c; peepholes i, o, f)."""
    hidden = dims[3]
    for b in range(dims[1]):
        if s >= lens[b]:
            continue
        t = lens[b] - 1 - s if reverse else s
        row, recurrent, state = xw[_x_row(t, b, dims)], hp[b], c[b]
        for j in range(pre.shape[0]):
            pre[j] = row[j] + recurrent[j] + bsum[j]
        i, o, f, g = pre[:hidden], pre[hidden : 2 * hidden], pre[2 * hidden : 3 * hidden], pre[3 * hidden :]
        for j in range(hidden):
            i[j] += peep[j] * state[j]
            f[j] += peep[2 * hidden + j] * state[j]
        call_late(_GATE_SLOT, (i, acts[0], alphas[0], betas[0], clip))
        if dims[6]:  # input_forget
            for j in range(hidden):
                f[j] = np.float32(1) - i[j]
        else:
            call_late(_GATE_SLOT, (f, acts[0], alphas[0], betas[0], clip))
        call_late(_GATE_SLOT, (g, acts[1], alphas[1], betas[1], clip))
        for j in range(hidden):
            state[j] = f[j] * state[j] + i[j] * g[j]
            o[j] += peep[hidden + j] * state[j]
            cell[j] = state[j]
        call_late(_GATE_SLOT, (o, acts[0], alphas[0], betas[0], clip))
        # h, the cell's own activation, is never clipped
        call_late(_GATE_SLOT, (cell, acts[2], alphas[2], betas[2], np.float32(-1)))
        at, out = _y_at(t, d, b, dims), h[b]
        for j in range(hidden):
            out[j] = o[j] * cell[j]
            y[at + j] = out[j]


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def _gru_gates(s, reverse, xw, hp, h, bsum, lens, dims, acts, alphas, betas, clip, pre, z, reset, rh):
    """A GRU step's update gate ``z``, reset gate ``reset`` and ``rh = reset * h`` (0 for
    entries done)."""
    hidden = dims[3]
    update = pre[: 2 * hidden]
    for b in range(dims[1]):
        if s >= lens[b]:
            for j in range(hidden):
                rh[b, j] = 0
            continue
        t = lens[b] - 1 - s if reverse else s
        row, recurrent = xw[_x_row(t, b, dims)], hp[b]
        for j in range(2 * hidden):
            update[j] = row[j] + recurrent[j] + bsum[j]
        call_late(_GATE_SLOT, (update, acts[0], alphas[0], betas[0], clip))
        for j in range(hidden):
            z[b, j] = update[j]
            reset[b, j] = update[hidden + j]
            rh[b, j] = update[hidden + j] * h[b, j]


@njit(inline="always", nogil=True, cache=True, error_model="numpy")
def _gru_candidates(
    s, d, reverse, xw, hp, hq, h, bias, bsum, lens, y, dims, acts, alphas, betas, clip, pre, z, reset
):
    """The rest of a GRU step after :func:`_gru_gates`: the candidate and the new state. With
    ``linear_before_reset`` (``dims[6]``) the candidate takes reset * (h Rh^T + Rbh), h Rh^T
    being ``hp``'s last columns; otherwise (reset * h) Rh^T, from ``hq``."""
    hidden, rows = dims[3], 3 * dims[3]
    candidate = pre[:hidden]
    for b in range(dims[1]):
        if s >= lens[b]:
            continue
        t = lens[b] - 1 - s if reverse else s
        row = xw[_x_row(t, b, dims)][2 * hidden :]
        if dims[6]:
            recurrent, r_bias = hp[b][2 * hidden :], bias[rows + 2 * hidden :]
            for j in range(hidden):
                candidate[j] = row[j] + bias[2 * hidden + j] + reset[b, j] * (recurrent[j] + r_bias[j])
        else:
            for j in range(hidden):
                candidate[j] = row[j] + hq[b, j] + bsum[2 * hidden + j]
        call_late(_GATE_SLOT, (candidate, acts[1], alphas[1], betas[1], clip))
        at, out = _y_at(t, d, b, dims), h[b]
        for j in range(hidden):
            out[j] = (np.float32(1) - z[b, j]) * candidate[j] + z[b, j] * out[j]
            y[at + j] = out[j]


RNN_CELLS, LSTM_CELLS, GRU_GATES, GRU_CANDIDATES = range(4)


@njit(nogil=True, cache=True, error_model="numpy")
def step(phase, s, d, reverse, xw, hp, hq, h, c, bias, bsum, peep, lens, y, dims, acts, alphas, betas, clip,
         pre, cell, z, reset, rh):  # fmt: skip
    """Time step ``s`` of direction ``d``, every batch entry still running: ``phase`` says
    which cells (a GRU's step is two phases, its candidate's product between them). ``hp``
    holds h R^T (for a GRU without linear_before_reset, its z and r columns only, and ``hq``
    then the candidate's (reset * h) Rh^T); ``pre``, ``cell``, ``z``, ``reset`` and ``rh`` are
    scratch."""
    if phase == RNN_CELLS:
        _rnn_cells(s, d, reverse, xw, hp, h, bsum, lens, y, dims, acts, alphas, betas, clip, pre)
    elif phase == LSTM_CELLS:
        _lstm_cells(
            s, d, reverse, xw, hp, h, c, bsum, peep, lens, y, dims, acts, alphas, betas, clip, pre, cell
        )
    elif phase == GRU_GATES:
        _gru_gates(s, reverse, xw, hp, h, bsum, lens, dims, acts, alphas, betas, clip, pre, z, reset, rh)
    else:
        _gru_candidates(
            s, d, reverse, xw, hp, hq, h, bias, bsum, lens, y, dims, acts, alphas, betas, clip, pre, z, reset
        )


_STEP_SLOT = "flowrt_recurrent_step"
# step's argument types, in order: phase, s, d, reverse; xw, hp, hq, h, c; bias, bsum, peep;
# lens, y, dims, acts, alphas, betas, clip; pre, cell; z, reset, rh
_STEP_ARGS = (
    (_I8,) * 4
    + (_F2,) * 5
    + (_F1R, _F1, _F1R)
    + (_I1, _F1, _I1, _I1, _F1, _F1, _F4)
    + (_F1,) * 2
    + (_F2,) * 3
)
STEP = LateFunction(step, _STEP_ARGS, _STEP_SLOT)


# A block of the recurrent product starts on a multiple of this many gate rows: the threads
# writing neighbouring blocks of ``hp`` then share no cache line (16 floats).
_BLOCK_ROWS = 16


@njit(**NATIVE)
def _product_slice(task, _step, h, r, hp, tasks):
    """Task ``task`` of ``tasks`` of ``hp = h @ r.T``: a block of the gate rows of ``r``, so
    that each thread reads only its part of R, step after step."""
    rows = r.shape[0]
    lo = 0 if task == 0 else task * rows // tasks // _BLOCK_ROWS * _BLOCK_ROWS
    hi = rows if task == tasks - 1 else (task + 1) * rows // tasks // _BLOCK_ROWS * _BLOCK_ROWS
    if hi > lo:
        sgemm(False, True, np.float32(1), h, r[lo:hi], np.float32(0), hp[:, lo:hi])


PRODUCT = SliceFunction(_product_slice)


def product_address() -> int:
    """The address of :func:`_product_slice` for the arrays :func:`direction` passes it
    (compiled, or loaded from numba's cache, on the first call)."""
    h = np.empty((1, 1), np.float32)
    r = np.empty((1, 1), np.float32)
    r.flags.writeable = False
    return PRODUCT.address((h, r, h, np.int64(1)))


@njit(nogil=True, cache=True, error_model="numpy")
def direction(kind, d, x, w, r, bias, peep, h0, c0, lens, y, y_h, y_c, dims, acts, alphas, betas, clip,
              blocks_at, tasks):  # fmt: skip
    """Direction ``d`` of an RNN, GRU or LSTM layer (``kind``): its part of Y, Y_h and Y_c
    (flat, see the module doc for ``dims``), from the flat inputs (``w``, ``r``, ``bias``,
    ``peep``, ``acts``, ``alphas`` and ``betas``: this direction's only; ``clip`` < 0: none).
    The input projection and each step's product by R run as ``tasks`` blocks of gate rows
    in parallel when ``tasks`` > 1 (``blocks_at``: :func:`product_address`), else on the
    calling thread."""
    seq, batch, size, hidden = dims[0], dims[1], dims[2], dims[3]
    rows = (1 if kind == RNN else 3 if kind == GRU else 4) * hidden
    xw = np.empty((seq * batch, rows), np.float32)
    projection = (x.reshape((seq * batch, size)), w.reshape((rows, size)), xw, tasks)
    run = np.empty(0, np.int64)  # no record: the stages run
    if tasks > 1:  # every step's input projection, in blocks of gate rows as each step's product
        run_stages_native(1, 0, 0, projection, blocks_at, tasks, projection, run, run)
    else:
        sgemm(False, True, np.float32(1), projection[0], projection[1], np.float32(0), xw)
    split = kind == GRU and dims[6] == 0  # the candidate's product comes after the reset gate
    first = 2 * hidden if split else rows
    product = np.empty(batch * rows, np.float32)
    hp = product[: batch * first].reshape((batch, first))
    hq = product[batch * first :].reshape((batch, rows - first))
    r_first = r[: first * hidden].reshape((first, hidden))
    r_last = r[first * hidden :].reshape((rows - first, hidden))
    bsum = np.empty(rows, np.float32)
    for j in range(rows):
        bsum[j] = bias[j] + bias[rows + j]
    pre, cell = np.empty(rows, np.float32), np.empty(hidden, np.float32)
    h, c = np.empty((batch, hidden), np.float32), np.empty((batch, hidden), np.float32)
    z, reset, rh = np.empty_like(h), np.empty_like(h), np.empty_like(h)
    _load_states(d, h0, c0, h, c, dims)
    phase = RNN_CELLS if kind == RNN else LSTM_CELLS if kind == LSTM else GRU_GATES
    blocks = (h, r_first, hp, tasks)
    for s in range(seq):
        if tasks > 1:
            run_stages_native(1, 0, 0, blocks, blocks_at, tasks, blocks, run, run)
        else:
            sgemm(False, True, np.float32(1), h, r_first, np.float32(0), hp)
        # borrowed: a tuple of the arrays built each step, kept across the GRU's second call,
        # counted a reference to each of its twenty arrays a step
        args = borrowed((
            s, d, dims[7 + d], xw, hp, hq, h, c, bias, bsum, peep, lens, y, dims, acts, alphas, betas, clip,
            pre, cell, z, reset, rh,
        ))  # fmt: skip
        call_late(_STEP_SLOT, (phase, *args))
        if kind == GRU:
            if split:
                sgemm(False, True, np.float32(1), rh, r_last, np.float32(0), hq)
            call_late(_STEP_SLOT, (GRU_CANDIDATES, *args))
    _store_states(d, h, c, lens, y, y_h, y_c, dims)


@njit(nogil=True, cache=True)
def _load_states(d, h0, c0, h, c, dims):
    """Direction ``d``'s initial states from the flat ``h0`` and ``c0`` into ``h`` and ``c``."""
    for b in range(dims[1]):
        at = _state_at(d, b, dims)
        for j in range(dims[3]):
            h[b, j], c[b, j] = h0[at + j], c0[at + j]


@njit(nogil=True, cache=True)
def _store_states(d, h, c, lens, y, y_h, y_c, dims):
    """Direction ``d``'s final states into ``y_h`` and ``y_c`` (0 for an entry of length 0,
    as in onnxruntime), and 0 into Y past each entry's end."""
    seq, hidden = dims[0], dims[3]
    for b in range(dims[1]):
        at, ran = _state_at(d, b, dims), lens[b] > 0
        for j in range(hidden):
            y_h[at + j] = h[b, j] if ran else np.float32(0)
            y_c[at + j] = c[b, j] if ran else np.float32(0)
        for t in range(lens[b], seq):
            at = _y_at(t, d, b, dims)
            for j in range(hidden):
                y[at + j] = 0


def compile_all() -> None:
    """Compile the slots' functions (or load them from numba's cache), at load; and register
    the launchers' symbol, which :func:`direction` links to, as ``preload`` does (a kernel of
    one worker asks for no slice function's address, which would register it)."""
    calls._register_parallel_tasks()
    GATE.address()
    STEP.address()
