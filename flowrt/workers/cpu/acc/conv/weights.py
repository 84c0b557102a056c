"""A conv's weights as CpuAcc's algorithms read them, and what they make of constant ones once."""

from __future__ import annotations

import numpy as np

from flowrt.engine.memory.weights import MANAGER
from flowrt.workers.cpu.acc.blas import read_only
from flowrt.workers.cpu.acc.conv.winograd import winograd_weights
from flowrt.workers.cpu.acc.conv.winograd4 import winograd4_weights
from flowrt.workers.cpu.acc.conv.winograd_conv import winograd_panels
from flowrt.workers.cpu.acc.packed_gemm import column_bias, column_panels
from flowrt.workers.cpu.acc.tile_ir import PANEL_LAYOUT
from flowrt.workers.cpu.acc.tiles import pack_panels, pad_rows


class ConvWeights:
    """The weights of one conv layer: ``packed`` (groups, M / groups, C / groups * kh * kw), the
    GEMMs' left operand, and ``shape`` (M, C / groups, kh, kw) when they are constant (None when
    they are an input, packed per call by :meth:`pack`). The forms an algorithm derives from
    them (one matrix per tap, Winograd transforms, register-tile panels) are kept for the
    constant weights, made on first use and shared with every other load of the same constant
    (``flowrt.engine.memory.weights``); for others they are made per call."""

    def __init__(self, groups: int, constant: np.ndarray | None) -> None:
        self.groups = groups
        self._constant = constant
        self.packed = (
            None
            if constant is None
            else MANAGER.shared(constant, "conv.packed", groups, lambda: self.pack(constant))
        )
        self.shape = None if constant is None else tuple(constant.shape)
        self._taps: np.ndarray | None = None
        self._winograd: dict[int, np.ndarray] = {}
        self._winograd_panels: dict[int, np.ndarray] = {}
        self._panels: tuple[np.ndarray, np.ndarray] | None = None
        self._columns: tuple[np.ndarray, np.ndarray] | None = None

    def pack(self, w: np.ndarray) -> np.ndarray:
        """Weights ``w`` (M, C / groups, kh, kw) as (groups, M / groups, C / groups * kh * kw)
        float32, read-only."""
        groups = self.groups
        return read_only(np.ascontiguousarray(w, np.float32).reshape(groups, w.shape[0] // groups, -1))

    def taps(self, w: np.ndarray, w_shape: tuple[int, ...]) -> np.ndarray:
        """Packed weights (1, M, C*kh*kw) as one (M, C) matrix per kernel tap: (kh*kw, M, C)."""
        if self._taps is not None and w is self.packed:
            return self._taps
        m, c, kh, kw = w_shape

        def make() -> np.ndarray:
            return read_only(np.ascontiguousarray(w.reshape(m, c, kh * kw).transpose(2, 0, 1)))

        if w is not self.packed:
            return make()
        self._taps = self._shared("conv.taps", w_shape, make)
        return self._taps

    def winograd(self, w: np.ndarray, w_shape: tuple[int, ...], tile: int) -> np.ndarray:
        """The filters' Winograd transforms for ``tile`` x ``tile`` outputs ((tile + 2)^2, M, C)."""
        if w is self.packed and tile in self._winograd:
            return self._winograd[tile]

        def make() -> np.ndarray:
            return read_only((winograd_weights if tile == 2 else winograd4_weights)(w.reshape(w_shape)))

        if w is not self.packed:
            return make()
        u = self._winograd[tile] = self._shared("conv.winograd", (w_shape, tile), make)
        return u

    def winograd_panels(self, w: np.ndarray, w_shape: tuple[int, ...], tile: int) -> np.ndarray:
        """The filters' Winograd transforms for ``tile`` x ``tile`` outputs as register-tile
        panels, one set per tile element ((tile + 2)^2, M / TILE_ROWS, C, TILE_ROWS)."""
        if w is self.packed and tile in self._winograd_panels:
            return self._winograd_panels[tile]

        def make() -> np.ndarray:
            u = (winograd_weights if tile == 2 else winograd4_weights)(w.reshape(w_shape))
            return read_only(winograd_panels(u))

        if w is not self.packed:
            return make()
        panels = self._winograd_panels[tile] = self._shared(
            "conv.winograd_panels", (w_shape, tile, PANEL_LAYOUT), make
        )
        return panels

    def panels(self, w: np.ndarray, bias: np.ndarray, constant: bool) -> tuple[np.ndarray, np.ndarray]:
        """Packed weights ``w`` as register-tile panels per group, and the bias padded to match
        (``tiles.py``); kept when both are ``constant``."""
        if constant and self._panels is not None:
            return self._panels
        groups, mg = w.shape[0], w.shape[1]

        def make() -> np.ndarray:
            return read_only(np.stack([pack_panels(w[g]) for g in range(groups)]))

        panels = self._shared("conv.panels", (w.shape, PANEL_LAYOUT), make) if w is self.packed else make()
        padded = np.stack([pad_rows(bias[g * mg : (g + 1) * mg]) for g in range(groups)])
        if constant:
            self._panels = (panels, padded)
        return panels, padded

    def column_panels(self, w: np.ndarray, bias: np.ndarray, constant: bool) -> tuple[np.ndarray, np.ndarray]:
        """Packed weights ``w`` of one group (1, M, C) transposed, as panels of output channels
        (``packed_gemm.column_panels``), and the bias padded to them; kept when both are
        ``constant``."""
        if constant and self._columns is not None:
            return self._columns

        def make() -> np.ndarray:
            return column_panels(w[0].T)  # panel by panel from the rows of w: one copy

        panels = (
            self._shared("conv.column_panels", (w.shape, PANEL_LAYOUT), make) if w is self.packed else make()
        )
        columns = (panels, column_bias(panels, bias))
        if constant:
            self._columns = columns
        return columns

    def made(self, transform: str) -> bool:
        """Whether the panels ``transform`` (``conv.panels`` or ``conv.column_panels``) of the
        constant weights are made already, by this load or another of the same constant."""
        if self._constant is None or self.packed is None:
            return False
        return MANAGER.holds(self._constant, transform, (self.groups, (self.packed.shape, PANEL_LAYOUT)))

    def _shared(self, transform: str, params: object, make) -> np.ndarray:
        """``make()``, the ``transform`` of the layer's constant weights, shared with every
        other load of the same constant, and kept on disk where the constant's file is
        (``params`` name all it hangs on: the panels' layout too)."""
        assert self._constant is not None  # only the constant weights' forms are shared
        return MANAGER.shared(self._constant, transform, (self.groups, params), make, lasting=True)
