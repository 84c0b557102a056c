"""A conv's weights as CpuAcc's algorithms read them, and what they make of constant ones once."""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.winograd import winograd_weights
from flowrt.engine.memory.weights import MANAGER
from flowrt.workers.cpu.acc.blas import read_only
from flowrt.workers.cpu.acc.conv.winograd4 import winograd4_weights
from flowrt.workers.cpu.acc.conv.winograd_conv import winograd_panels
from flowrt.workers.cpu.acc.half import to_half
from flowrt.workers.cpu.acc.packed_gemm import column_bias, column_panels
from flowrt.workers.cpu.acc.tile_ir import PANEL_LAYOUT
from flowrt.workers.cpu.acc.tiles import pack_panels, pad_rows


class ConvWeights:
    """The weights of one conv layer: ``packed`` (groups, M / groups, C / groups * kh * kw), the
    GEMMs' left operand, and ``shape`` (M, C / groups, kh, kw) when they are constant (None when
    they are an input, packed per call by :meth:`pack`). The forms an algorithm derives from
    them (one matrix per tap, Winograd transforms, register-tile panels) are kept for the
    constant weights, made on first use and shared with every other load of the same constant
    (``flowrt.engine.memory.weights``); for others they are made per call. With ``half`` the
    register-tile panels of the constant weights hold float16 (``half.py``): half the bytes,
    widened as the tiles read them; the forms BLAS reads stay float32."""

    def __init__(self, groups: int, constant: np.ndarray | None, half: bool = False) -> None:
        self.groups = groups
        self._constant = constant
        self.half = half
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

        def make(half: bool = False) -> np.ndarray:
            u = (winograd_weights if tile == 2 else winograd4_weights)(w.reshape(w_shape))
            return to_half(winograd_panels(u)) if half else read_only(winograd_panels(u))

        if w is not self.packed:
            return make()
        # F(4x4, 3x3)'s output transform multiplies the rounding of float16 transforms into
        # errors of about 5e-3 of the output (F(2x2, 3x3): 5e-4): its panels stay float32.
        panels = self._winograd_panels[tile] = self._shared(
            "conv.winograd_panels", (w_shape, tile, PANEL_LAYOUT), make, self.half and tile == 2
        )
        return panels

    def panels(self, w: np.ndarray, bias: np.ndarray, constant: bool) -> tuple[np.ndarray, np.ndarray]:
        """Packed weights ``w`` as register-tile panels per group, and the bias padded to match
        (``tiles.py``); kept when both are ``constant``."""
        if constant and self._panels is not None:
            return self._panels
        groups, mg = w.shape[0], w.shape[1]

        def make(half: bool = False) -> np.ndarray:
            panels = np.stack([pack_panels(w[g]) for g in range(groups)])
            return to_half(panels) if half else read_only(panels)

        if w is self.packed:
            panels = self._shared("conv.panels", (w.shape, PANEL_LAYOUT), make, self.half)
        else:
            panels = make()
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

        def make(half: bool = False) -> np.ndarray:
            return column_panels(w[0].T, half)  # panel by panel from the rows of w: one copy

        if w is self.packed:
            panels = self._shared("conv.column_panels", (w.shape, PANEL_LAYOUT), make, self.half)
        else:
            panels = make()
        columns = (panels, column_bias(panels, bias))
        if constant:
            self._columns = columns
        return columns

    def made(self, transform: str) -> bool:
        """Whether the panels ``transform`` (``conv.panels`` or ``conv.column_panels``) of the
        constant weights are made already, by this load or another of the same constant."""
        if self._constant is None or self.packed is None:
            return False
        params = (self.packed.shape, PANEL_LAYOUT, *(("float16",) if self.half else ()))
        return MANAGER.holds(self._constant, transform, (self.groups, params))

    def _shared(self, transform: str, params: tuple, make, half: bool = False) -> np.ndarray:
        """``make()`` (``make(True)``: its float16 form, where ``half``), the ``transform`` of
        the layer's constant weights, shared with every other load of the same constant, and
        kept on disk where the constant's file is (``params`` name all it hangs on: the
        panels' layout and their precision too)."""
        assert self._constant is not None  # only the constant weights' forms are shared
        if half:
            params, build = (*params, "float16"), lambda: make(True)
        else:
            build = make
        return MANAGER.shared(self._constant, transform, (self.groups, params), build, lasting=True)
