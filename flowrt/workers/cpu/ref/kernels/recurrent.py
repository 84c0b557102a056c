"""RNN, GRU and LSTM kernels: the ONNX equations step by step, in float64, cast back to X's type.

Each layer runs in layout 0 (sequence first; layout 1 is transposed in and out). A batch
entry whose ``sequence_lens`` is shorter than the sequence stops there: its later steps of Y
are 0, Y_h and Y_c hold its state at its last step (0 for an entry of length 0, as in
onnxruntime), and the reverse direction starts from its own last step. ``clip`` bounds the
input of every gate activation (not the cell's h).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from flowrt.engine.graph.layers.recurrent import (
    CellActivation,
    GRUDescriptor,
    LSTMDescriptor,
    RecurrentDescriptor,
    cell_activations,
    sequence_lengths,
)
from flowrt.workers.cpu.ref.kernels import ref_kernel
from flowrt.workers.cpu.ref.kernels.activation import sigmoid, softplus

Curve = Callable[[np.ndarray, float, float], np.ndarray]
CURVES: dict[str, Curve] = {
    "Sigmoid": lambda v, a, b: sigmoid(v),
    "Tanh": lambda v, a, b: np.tanh(v),
    "Relu": lambda v, a, b: np.maximum(v, 0),
    "Softsign": lambda v, a, b: v / (1 + np.abs(v)),
    "Softplus": lambda v, a, b: softplus(v),
    "LeakyRelu": lambda v, a, b: np.where(v >= 0, v, a * v),
    "ThresholdedRelu": lambda v, a, b: np.where(v > a, v, 0),
    "Elu": lambda v, a, b: np.where(v >= 0, v, a * np.expm1(np.minimum(v, 0))),
    "HardSigmoid": lambda v, a, b: np.clip(a * v + b, 0, 1),
    "Affine": lambda v, a, b: a * v + b,
    "ScaledTanh": lambda v, a, b: a * np.tanh(b * v),
}


class _Cell:
    """One direction's weights and activations, and the gate arithmetic they share."""

    def __init__(self, desc: RecurrentDescriptor, d: int, w, r, b, p) -> None:
        self.desc = desc
        self.activations = cell_activations(desc)[d]
        self.w, self.r = w[d], r[d]
        rows = self.w.shape[0]
        bias = np.zeros(2 * rows) if b is None else b[d]
        self.wb, self.rb = bias[:rows], bias[rows:]
        self.p = np.zeros(3 * self.r.shape[1]) if p is None else p[d]

    def act(self, which: int, v: np.ndarray, clip: bool = True) -> np.ndarray:
        """Activation ``which`` (0: f, 1: g, 2: h) of ``v``, clipped first when asked."""
        if clip and self.desc.clip is not None:
            v = np.clip(v, -self.desc.clip, self.desc.clip)
        spec: CellActivation = self.activations[which]
        with np.errstate(over="ignore"):
            return CURVES[spec.name](v, spec.alpha, spec.beta)


def _rnn_step(cell: _Cell, x, h, c):
    return cell.act(0, x @ cell.w.T + h @ cell.r.T + cell.wb + cell.rb), c


def _gru_step(cell: _Cell, x, h, c):
    wz, wr, wh = np.split(cell.w, 3)
    rz, rr, rh = np.split(cell.r, 3)
    wbz, wbr, wbh = np.split(cell.wb, 3)
    rbz, rbr, rbh = np.split(cell.rb, 3)
    z = cell.act(0, x @ wz.T + h @ rz.T + wbz + rbz)
    reset = cell.act(0, x @ wr.T + h @ rr.T + wbr + rbr)
    assert isinstance(cell.desc, GRUDescriptor)  # the GRU layer kind's descriptor
    if cell.desc.linear_before_reset:
        candidate = cell.act(1, x @ wh.T + reset * (h @ rh.T + rbh) + wbh)
    else:
        candidate = cell.act(1, x @ wh.T + (reset * h) @ rh.T + rbh + wbh)
    return (1 - z) * candidate + z * h, c


def _lstm_step(cell: _Cell, x, h, c):
    gates = x @ cell.w.T + h @ cell.r.T + cell.wb + cell.rb
    i, o, f, g = np.split(gates, 4, axis=-1)
    pi, po, pf = np.split(cell.p, 3)
    i = cell.act(0, i + pi * c)
    assert isinstance(cell.desc, LSTMDescriptor)  # the LSTM layer kind's descriptor
    f = 1 - i if cell.desc.input_forget else cell.act(0, f + pf * c)
    c_new = f * c + i * cell.act(1, g)
    o = cell.act(0, o + po * c_new)
    return o * cell.act(2, c_new, clip=False), c_new


def _run(desc: RecurrentDescriptor, step, x, w, r, b, lens, h0, c0=None, p=None):
    """(Y, Y_h, Y_c) of the layer; ``step(cell, x_t, h, c) -> (h, c)`` is one time step."""
    dtype = x.dtype
    if desc.layout:
        x, h0, c0 = (None if a is None else np.swapaxes(a, 0, 1) for a in (x, h0, c0))
    x, w, r, b, h0, c0, p = (
        None if a is None else np.asarray(a, np.float64) for a in (x, w, r, b, h0, c0, p)
    )
    seq, batch = x.shape[:2]
    dirs, hidden = desc.num_directions, r.shape[-1]
    lens = sequence_lengths(lens, seq, batch, desc.op)
    y = np.zeros((seq, dirs, batch, hidden))
    y_h, y_c = np.zeros((dirs, batch, hidden)), np.zeros((dirs, batch, hidden))
    entries = np.arange(batch)
    for d in range(dirs):
        cell = _Cell(desc, d, w, r, b, p)
        reverse = desc.direction == "reverse" or d == 1
        h = np.zeros((batch, hidden)) if h0 is None else h0[d]
        c = np.zeros((batch, hidden)) if c0 is None else c0[d]
        for s in range(seq):
            active = s < lens
            t = np.where(active, lens - 1 - s if reverse else s, 0)
            h_new, c_new = step(cell, x[t, entries], h, c)
            h = np.where(active[:, None], h_new, h)
            c = np.where(active[:, None], c_new, c)
            y[t[active], d, entries[active]] = h[active]
        ran = (lens > 0)[:, None]  # an entry of length 0 has states of 0, as in onnxruntime
        y_h[d], y_c[d] = np.where(ran, h, 0), np.where(ran, c, 0)
    if desc.layout:
        y, y_h, y_c = np.transpose(y, (2, 0, 1, 3)), np.swapaxes(y_h, 0, 1), np.swapaxes(y_c, 0, 1)
    return tuple(a.astype(dtype) for a in (y, y_h, y_c)[: desc.max_outputs])


@ref_kernel("RNN")
def rnn(desc, x, w, r, b=None, sequence_lens=None, initial_h=None):
    """RNN's (Y, Y_h)."""
    return _run(desc, _rnn_step, x, w, r, b, sequence_lens, initial_h)


@ref_kernel("GRU")
def gru(desc, x, w, r, b=None, sequence_lens=None, initial_h=None):
    """GRU's (Y, Y_h)."""
    return _run(desc, _gru_step, x, w, r, b, sequence_lens, initial_h)


@ref_kernel("LSTM")
def lstm(desc, x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None):
    """LSTM's (Y, Y_h, Y_c)."""
    return _run(desc, _lstm_step, x, w, r, b, sequence_lens, initial_h, initial_c, p)
