"""QLinearConv and QLinearMatMul on uint8 activations and int8 weights: integer products with
int32 accumulation (``int8_gemm``), requantized as they are stored.

A layer's product is ``acc = sum((x - x_zp) * (w - w_zp))`` over its reduction, and its output
``y = saturate(round_half_even(acc * x_scale * w_scale / y_scale) + y_zp)``. With the weights'
zero points 0 (symmetric int8 weights, what quantize_static writes), the input's zero point
folds into the bias once: ``acc = sum(x * w) - x_zp * sum(w)``, and the GEMM's epilogue does
the rest. Otherwise each output also loses ``w_zp * sum(x - x_zp)`` over its column, added by
a second pass over the int32 products.

QLinearConv lays its input out as columns (im2col, the padding filled with ``x_zp``, which
is zero after the subtraction) unless it is a 1x1 convolution of stride 1 without padding,
whose input is its own column matrix; a depthwise one runs ``conv/depthwise_int8.py``.
QLinearMatMul multiplies ``w^T @ a^T``: the weights (K, N), constant, are packed once as the
left operand, with one scale per column; the GEMM reads the rows of ``a`` and stores across,
so that neither is transposed. ONNX Runtime's QGemm is a QLinearMatMul of a matrix with an
int32 bias C per column (its weights (N, K) as given where ``transB``) and ``alpha`` joining
the output scale.

Taken: uint8 input and output, int8 weights, per-tensor input and output parameters, weights'
scale and zero point per tensor or per output channel (per column), a 2-D convolution of one
group or depthwise, a MatMul by constant 2-D weights, a QGemm of an untransposed A with C
per column. The rest runs on CpuRef.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flowrt.engine.graph.layers.conv import conv_kernel_shape, window_geometry
from flowrt.engine.memory.weights import MANAGER
from flowrt.errors import BackendError
from flowrt.registry import Support, WorkloadInfo
from flowrt.types import DataType
from flowrt.workers.cpu.acc import int8_gemm, int8_windows
from flowrt.workers.cpu.acc.calls import NATIVE, SliceFunction
from flowrt.workers.cpu.acc.conv.depthwise_int8 import DepthwiseInt8, is_depthwise
from flowrt.workers.cpu.acc.conv.int8_layout import IM2COL, PAD
from flowrt.workers.cpu.acc.kernels import acc_kernel
from flowrt.workers.cpu.acc.quantized_parameters import ParameterCache, per_row, requantization_scales

D = DataType


# Where each kind keeps its parameters among its inputs: (x_scale, x_zero, w_scale, w_zero,
# y_scale, y_zero), and its bias (None: it has none). QGemm's C sits before its output's.
PARAMETERS = {
    "QLinearConv": (1, 2, 4, 5, 6, 7),
    "QLinearMatMul": (1, 2, 4, 5, 6, 7),
    "QGemm": (1, 2, 4, 5, 7, 8),
}
BIAS = {"QLinearConv": 8, "QLinearMatMul": None, "QGemm": 6}


def _operands(kind: str, values: list) -> tuple:
    """(x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero, bias) of a layer's inputs."""
    values = list(values) + [None] * 9
    bias = BIAS[kind]
    return (values[0], *(values[i] for i in PARAMETERS[kind][:2]), values[3],
            *(values[i] for i in PARAMETERS[kind][2:]), None if bias is None else values[bias])  # fmt: skip


def _why_not_gemm(info: WorkloadInfo) -> str | None:
    """Why CpuAcc declines a QGemm beyond what it declines of a QLinearMatMul, or None."""
    desc, a, b = info.descriptor, info.inputs[0], info.inputs[3]
    if desc.transA:
        return "A not transposed"
    if a is None or b is None or a.shape is None or b.shape is None or len(a.shape) != 2:
        return "a 2-D A"
    bias = _operands(info.kind, list(info.inputs))[8]
    columns = b.shape[0 if desc.transB else 1]
    if bias is not None and (bias.shape is None or len(bias.shape) != 1 or bias.shape[0] != columns):
        return "C as one value per column of B'"
    return None


def _why_not(info: WorkloadInfo) -> str | None:
    """Why CpuAcc declines the layer (see the module doc), or None."""
    conv = info.kind == "QLinearConv"
    x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero, _ = _operands(info.kind, list(info.inputs))
    if x is None or x.dtype is not D.UINT8 or w is None or w.dtype is not D.INT8:
        return "uint8 data and int8 weights"
    if y_zero is None or y_zero.dtype is not D.UINT8:
        return "a uint8 output"
    for param in (x_scale, x_zero, y_scale):
        if param is None or param.num_elements != 1:
            return "per-tensor input and output parameters"
    if x.shape is None or w.shape is None:
        return "known ranks"
    if conv:
        group = info.descriptor.group
        if len(x.shape) != 4 or len(w.shape) != 4:
            return "2-D convolutions"
        if group != 1 and not is_depthwise(group, x.shape[1], w.shape):
            return "2-D convolutions of one group or depthwise (one filter per channel)"
    elif len(w.shape) != 2 or len(x.shape) < 2:
        return "a MatMul by 2-D weights"
    transposed = info.kind == "QGemm" and info.descriptor.transB
    channels = w.shape[0] if conv or transposed else w.shape[1]
    for param in (w_scale, w_zero):
        if param is None or param.num_elements not in (1, channels):
            return "weights' parameters per tensor or per output channel"
    return _why_not_gemm(info) if info.kind == "QGemm" else None


@njit(nogil=True, cache=True)
def _column_sums(cols, sums):
    """``sums[n] = sum(cols[:, n])`` in int32."""
    sums[:] = 0
    for k in range(cols.shape[0]):
        row = cols[k]
        for n in range(cols.shape[1]):
            sums[n] += np.int32(row[n])


@njit(nogil=True, cache=True)
def _requantize_corrected(acc, sums, w_zero, scale, zero, low, high, out):
    """``out = clip(rint((acc - w_zero[m] * sums[n]) * scale[m]) + zero, low, high)``: the
    products of weights with nonzero zero points (``acc`` holds the rest)."""
    for m in range(acc.shape[0]):
        for n in range(acc.shape[1]):
            v = np.float32(acc[m, n] - w_zero[m] * sums[n]) * scale[m]
            out[m, n] = np.uint8(min(max(np.rint(v) + zero, low), high))


def _panel_rows(kernel: int) -> int:
    """Rows of a panel of packed weights: TILE_ROWS, or 1 for the portable loops' plain rows."""
    return 1 if kernel == int8_gemm.PORTABLE else int8_gemm.TILE_ROWS


@njit(nogil=True, cache=True, inline="always")
def _panels_of(panels, unit_bytes, kernel, first, last):
    """The packed weights of rows ``first .. last`` (whole panels)."""
    unit = 1 if kernel == int8_gemm.PORTABLE else int8_gemm.TILE_ROWS
    return panels[(first // unit) * unit_bytes : -(-last // unit) * unit_bytes]


@njit(**NATIVE)
def _qgemm_slice(s, _step, rows, columns, panels, unit_bytes, kernel, x, bias, scale, zero, out):
    """Slice ``s`` of :data:`QGEMM`: one block of rows ``rows[r] .. rows[r + 1]`` (whole
    panels) by one range of columns ``columns[c] .. columns[c + 1]`` of the product."""
    r, c = s // (columns.shape[0] - 1), s % (columns.shape[0] - 1)
    first, last = rows[r], rows[r + 1]
    int8_gemm.qgemm_columns(
        _panels_of(panels, unit_bytes, kernel, first, last), kernel, last - first, x, columns[c],
        columns[c + 1], bias[first:last], scale[first:last], zero, 0, 255, out[first:last],
    )  # fmt: skip


QGEMM = SliceFunction(_qgemm_slice)


@njit(**NATIVE)
def _qgemm_rows_slice(s, _step, rows, columns, panels, unit_bytes, kernel, xt, bias, scale, zero, out):
    """Slice ``s`` of :data:`QGEMM_ROWS`: :func:`_qgemm_slice` with ``xt`` (N, K) and ``out``
    (N, M) the other way round (``int8_gemm.qgemm_rows``)."""
    r, c = s // (columns.shape[0] - 1), s % (columns.shape[0] - 1)
    first, last = rows[r], rows[r + 1]
    int8_gemm.qgemm_rows(
        _panels_of(panels, unit_bytes, kernel, first, last), kernel, last - first, xt, columns[c],
        columns[c + 1], bias[first:last], scale[first:last], zero, 0, 255, out[:, first:last],
    )  # fmt: skip


QGEMM_ROWS = SliceFunction(_qgemm_rows_slice)


@njit(**NATIVE)
def _qgemm_windows_slice(
    s, _step, rows, columns, panels, unit_bytes, kernel, x, offsets, pitch, block_pitch, out_w, bias, scale,
    zero, out,
):  # fmt: skip
    """Slice ``s`` of :data:`QGEMM_WINDOWS`: :func:`_qgemm_slice` of the implicit column matrix
    of a padded input (``int8_windows.qgemm_windows``), its virtual columns split."""
    r, c = s // (columns.shape[0] - 1), s % (columns.shape[0] - 1)
    first, last = rows[r], rows[r + 1]
    int8_windows.qgemm_windows(
        _panels_of(panels, unit_bytes, kernel, first, last), kernel, last - first, x, offsets, pitch,
        block_pitch, out_w, columns[c], columns[c + 1], bias[first:last], scale[first:last], zero, 0, 255,
        out[first:last],
    )  # fmt: skip


QGEMM_WINDOWS = SliceFunction(_qgemm_windows_slice)


def _unit_bytes(packed) -> int:
    """Bytes of packed weights per panel (per row for the portable loops): ``_panels_of``'s unit."""
    return packed.panels.shape[0] // max(1, -(-packed.m // _panel_rows(packed.kernel)))


def _run_gemm(function: SliceFunction, packed, x, columns: int, params, out, workers: int) -> None:
    """The requantizing product split across ``workers`` (:func:`_gemm_slices`) by
    ``function``: :data:`QGEMM` (``x`` (K, N), ``out`` (M, N)) or :data:`QGEMM_ROWS` (both the
    other way round)."""
    bias, scale, zero, _ = params
    rows, column_bounds = _gemm_slices(packed, columns, workers)
    args = (rows, column_bounds, packed.panels, _unit_bytes(packed), packed.kernel, x, bias, scale, zero, out)
    function.run((rows.shape[0] - 1) * (column_bounds.shape[0] - 1), args)


# Multiply-adds below which a product runs on the calling thread alone: waking the other
# workers costs more than they would save (a few microseconds on a shared 2-core machine).
PARALLEL_WORK = 1 << 18
# Column bytes below which im2col runs on the calling thread alone: a byte of columns costs
# about as much as a hundred multiply-adds (resnet50's 7x7 layers: 225 KB of columns, 162 us
# on one thread, 85 on two).
PARALLEL_COLUMNS = 1 << 16
# Stride-1 convs multiply the windows of their padded input (``_windows``) instead of a column
# matrix where their output rows are at most WINDOWS_WIDTH wide (laid end to end at the padded
# width: a block of columns spans two rows) or fill whole blocks of columns but for at most
# WINDOWS_WASTE of each row (a row on whole blocks, its last block partly computed for
# nothing). In chains of eight resnet50 int8 layers, us a layer, columns -> windows: 7x7
# 410-590 -> 245-455, 14x14 275-360 -> 215-225. On whole blocks, one layer, us on one / two
# threads, im2col + GEMM -> pad + GEMM: 56x56 64 -> 64 362 / 228 -> 316 / 197, 28x28
# 128 -> 128 346 / 253 -> 297 / 186.
WINDOWS_WIDTH = 16
WINDOWS_WASTE = 0.15


def _block_pitch(out_w: int, pitch: int) -> int | None:
    """The virtual pitch of the windows' product for output rows ``out_w`` wide (see above),
    or None where the column matrix serves better."""
    if out_w <= WINDOWS_WIDTH:
        return pitch
    whole = -(-out_w // int8_gemm.TILE_COLUMNS) * int8_gemm.TILE_COLUMNS
    return whole if whole <= out_w * (1 + WINDOWS_WASTE) else None


def _split(size: int, unit: int, parts: int) -> np.ndarray:
    """Boundaries of ``parts`` ranges over ``size``, each a whole number of ``unit`` but the last."""
    units = -(-size // unit)
    parts = max(1, min(parts, units))
    edges = [min(size, (units * i // parts) * unit) for i in range(parts + 1)]
    edges[-1] = size
    return np.array(edges, np.int64)


def _gemm_slices(packed, columns: int, workers: int) -> tuple[np.ndarray, np.ndarray]:
    """(row bounds, column bounds) of a product's slices: its columns split across the
    workers, or, with fewer column tiles than two per worker (a late layer's few pixels), its
    rows: each worker then streams part of the weights instead of all of them."""
    if packed.m * packed.k * columns < PARALLEL_WORK or workers == 1:
        return np.array([0, packed.m], np.int64), np.array([0, columns], np.int64)
    if -(-columns // int8_gemm.TILE_COLUMNS) >= 2 * workers:
        return np.array([0, packed.m], np.int64), _split(columns, int8_gemm.TILE_COLUMNS, workers)
    return _split(packed.m, _panel_rows(packed.kernel), workers), np.array([0, columns], np.int64)


def _gemm_parameters(packed, reduction: int, bias, alpha=None):
    """What the GEMM makes of a layer's scales and zero points: per output row, the
    requantization scale (QGemm's ``alpha`` first multiplying the input's) and the int32 bias
    with the zero-point terms folded in."""
    rows = packed.m

    def make(x_scale, x_zero, w_scale, w_zero, y_scale, y_zero):
        if alpha is not None:
            x_scale = alpha * np.float32(np.asarray(x_scale).reshape(()))
        x_zp = np.int64(np.asarray(x_zero).reshape(()))
        w_zp = per_row(w_zero, rows, np.int64)
        total = np.zeros(rows, np.int64) if bias is None else bias.astype(np.int64)
        # sum((x - xz) * (w - wz)) = sum(x * w) - xz * sum(w) - wz * sum(x) + K * xz * wz
        total = total - x_zp * packed.row_sums.astype(np.int64) + reduction * x_zp * w_zp
        return (
            total.astype(np.int32),
            requantization_scales(x_scale, w_scale, y_scale, rows),
            int(np.asarray(y_zero).reshape(())),
            w_zp.astype(np.int32) if np.any(w_zp) else None,
        )

    return make


def _gemm(packed, params, cols, out, workers: int) -> None:
    """``out (M, N) uint8 = requantized(W @ cols)``, its columns split across ``workers``; with
    nonzero weight zero points, through int32 products and :func:`_requantize_corrected`."""
    bias, scale, zero, w_zero = params
    columns = cols.shape[1]
    if w_zero is None:
        _run_gemm(QGEMM, packed, cols, columns, params, out, workers)
        return
    acc = np.empty(out.shape, np.int32)
    int8_gemm.igemm(packed, cols, 0, columns, bias, acc)
    sums = np.empty(columns, np.int32)
    _column_sums(cols, sums)
    _requantize_corrected(acc, sums, w_zero, scale, np.float32(zero), np.float32(0), np.float32(255), out)


@acc_kernel("QLinearConv", "QLinearMatMul", "QGemm")
class QLinearKernel:
    """QLinearConv, QLinearMatMul or QGemm (see the module doc)."""

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        why = _why_not(info)
        if why is not None:
            return Support.no(f"CpuAcc {info.kind} takes {why} only")
        return Support.yes()

    def __init__(self, info: WorkloadInfo, workers: int) -> None:
        if info.activation is not None:
            raise BackendError(f"CpuAcc {info.kind} {info.layer_name!r} cannot apply a fused activation")
        self.info, self.workers = info, workers
        self.conv = info.kind == "QLinearConv"
        constants = list(info.constants) + [None] * 9
        w = constants[3]
        if w is None:
            raise BackendError(f"CpuAcc {info.kind} {info.layer_name!r} needs constant weights, got an input")
        self.parameters = PARAMETERS[info.kind]
        if self.conv:
            self.filters = w.shape[0]
            weights = w.reshape(self.filters, -1)
            kernel = conv_kernel_shape(info.descriptor, w.shape, info.kind)
            self.kernel = (int(kernel[0]), int(kernel[1]))  # type: ignore[arg-type]  # constant weights: ints
            self.desc = info.descriptor
        elif info.kind == "QGemm" and info.descriptor.transB:  # B (N, K): the packed layout already
            self.filters, weights = w.shape[0], w
        else:
            self.filters = w.shape[1]
            weights = np.ascontiguousarray(w.T)
        at = BIAS[info.kind]
        bias = None if at is None else constants[at]
        if at is not None and len(info.inputs) > at and info.inputs[at] is not None and bias is None:
            raise BackendError(f"CpuAcc {info.kind} {info.layer_name!r} needs a constant bias, got an input")
        # QGemm's alpha joins the input's scale, as ONNX Runtime forms the output scale
        # (alpha * a_scale * b_scale / y_scale).
        self.alpha = np.float32(info.descriptor.alpha) if info.kind == "QGemm" else None
        # Scales and zero points that are constants (as a QDQ model's always are): what they
        # make is made at the first run only (ParameterCache).
        self.constant_parameters = all(constants[i] is not None for i in self.parameters)
        self._geometries: dict[tuple, tuple] = {}
        self._window_plans: dict[tuple, tuple] = {}  # per input shape, see _windows
        self.depthwise = (
            DepthwiseInt8(w, bias, workers, self.constant_parameters)
            if self.conv and is_depthwise(self.desc.group, w.shape[0], w.shape)
            else None
        )
        if self.depthwise is not None:
            return
        self.reduction = weights.shape[1]
        # Keyed by how the constant was read: one array may be a conv's filters, a MatMul's
        # (K, N) weights (packed transposed) or a QGemm's (N, K) ones (packed as they are).
        as_given = self.conv or weights is w
        self.packed = MANAGER.shared(
            w, "int8.packed", as_given, lambda: int8_gemm.pack_weights(np.ascontiguousarray(weights))
        )
        self.params = ParameterCache(
            _gemm_parameters(self.packed, self.reduction, bias, self.alpha), self.constant_parameters
        )

    def execute(self, inputs, outputs=None):
        x = np.asarray(inputs[0])
        if self.depthwise is not None:
            return [self._depthwise(x, [inputs[i] for i in self.parameters], outputs)]
        params = self.params(*(inputs[i] for i in self.parameters))
        if not self.conv:
            return [self._matmul(x, params, outputs)]
        return [self._conv(x, np.uint8(np.asarray(inputs[2]).reshape(())), params, outputs)]

    def _geometry(self, x):
        """The output's shape and the window's layout (kernel, strides, dilations, leading pads),
        once per input shape."""
        found = self._geometries.get(x.shape)
        if found is None:
            batch, _, height, width = x.shape
            geometry = window_geometry(self.desc, (height, width), self.kernel)
            out_h, out_w = geometry.out
            assert out_h is not None and out_w is not None  # the input's sizes are known here
            layout = (*self.kernel, *geometry.strides, *geometry.dilations, *geometry.pads_begin)
            found = self._geometries[x.shape] = ((batch, self.filters, out_h, out_w), layout, geometry)
        return found

    def _depthwise(self, x, params, outputs):
        shape, layout, _ = self._geometry(x)
        out = np.empty(shape, np.uint8) if outputs is None else outputs[0]
        assert self.depthwise is not None
        self.depthwise.run(x, tuple(params), layout, out)
        return out

    def _conv(self, x, zero, params, outputs):
        shape, layout, geometry = self._geometry(x)
        batch, _, out_h, out_w = shape
        out = np.empty(shape, np.uint8) if outputs is None else outputs[0]
        direct = (
            self.kernel == (1, 1)
            and geometry.strides == (1, 1)
            and not any(geometry.pads_begin)
            and not any(geometry.pads_end)
        )
        if (
            not direct
            and geometry.strides == (1, 1)
            and params[3] is None
            and self.packed.kernel != int8_gemm.PORTABLE
            and _block_pitch(out_w, x.shape[3] + geometry.pads_begin[1] + geometry.pads_end[1]) is not None
        ):
            self._windows(x, zero, params, geometry, out)
            return out
        cols = None if direct else np.empty((self.reduction, out_h * out_w), np.uint8)
        pairs = x.shape[1] * self.kernel[0]  # (channel, kernel row): im2col's units of work
        slices = 1 if cols is None or cols.size < PARALLEL_COLUMNS else min(self.workers, pairs)
        pair_bounds = np.array([pairs * i // slices for i in range(slices + 1)], np.int64)
        for b in range(batch):
            image = np.ascontiguousarray(x[b])
            if cols is None:
                source = image.reshape(image.shape[0], -1)
            else:
                IM2COL.run(pair_bounds.shape[0] - 1, (pair_bounds, image, layout, out_w, zero, cols))
                source = cols
            _gemm(self.packed, params, source, out[b].reshape(self.filters, -1), self.workers)
        return out

    def _windows(self, x, zero, params, geometry, out) -> None:
        """A stride-1 conv with no column matrix: the input padded (with its zero point), and
        the GEMM's row ``(c, i, j)`` the window of that padded input at ``c``'s plane, kernel
        row ``i`` and column ``j``, read as a row ``pitch`` (the padded width) long per output
        row (``int8_windows.qgemm_windows``)."""
        plan = self._window_plans.get(x.shape)
        if plan is None:
            plan = self._window_plans[x.shape] = self._window_plan(x.shape, geometry, out.shape[2:])
        offsets, padded_bytes, pad_bounds, pads, padded_h, pitch, block_pitch, rows, column_bounds = plan
        padded = np.empty(padded_bytes, np.uint8)
        bias, scale, y_zero, _ = params
        packed, out_w = self.packed, out.shape[3]
        for b in range(x.shape[0]):
            image = np.ascontiguousarray(x[b])
            PAD.run(pad_bounds.shape[0] - 1, (pad_bounds, image, zero, *pads, padded_h, pitch, padded))
            args = (
                rows, column_bounds, packed.panels, _unit_bytes(packed), packed.kernel, padded, offsets, pitch,
                block_pitch, out_w, bias, scale, y_zero, out[b].reshape(self.filters, -1),
            )  # fmt: skip
            QGEMM_WINDOWS.run((rows.shape[0] - 1) * (column_bounds.shape[0] - 1), args)

    def _window_plan(self, shape, geometry, out_shape) -> tuple:
        """What :meth:`_windows` needs of an input shape, once: each GEMM row's offset in the
        padded input, that input's bytes, the splits of the padding and of the product, the
        leading pads, the padded height, the pitch (padded width) and the product's virtual pitch."""
        channels, height, width = shape[1:]
        (pad_top, pad_left), (pad_bottom, pad_right) = geometry.pads_begin, geometry.pads_end
        padded_h, pitch = height + pad_top + pad_bottom, width + pad_left + pad_right
        (kernel_h, kernel_w), (dilation_h, dilation_w) = self.kernel, geometry.dilations
        c, i, j = np.meshgrid(np.arange(channels), np.arange(kernel_h), np.arange(kernel_w), indexing="ij")
        offsets = (
            (c * padded_h * pitch + i * dilation_h * pitch + j * dilation_w).reshape(-1).astype(np.int64)
        )
        # the last window's last row runs past the padded planes by the window's span, and the
        # GEMM reads a block of columns past any row's end
        padded_bytes = channels * padded_h * pitch + (kernel_w - 1) * dilation_w + int8_gemm.TILE_COLUMNS
        slices = 1 if padded_bytes < PARALLEL_COLUMNS else min(self.workers, channels)
        pad_bounds = np.array([channels * k // slices for k in range(slices + 1)], np.int64)
        block_pitch = _block_pitch(out_shape[1], pitch)
        assert block_pitch is not None  # _conv takes this path only then
        rows, column_bounds = _gemm_slices(self.packed, out_shape[0] * block_pitch, self.workers)
        return (
            offsets, padded_bytes, pad_bounds, (pad_top, pad_left), padded_h, pitch, block_pitch, rows,
            column_bounds,
        )  # fmt: skip

    def _matmul(self, x, params, outputs):
        """``a @ w`` as ``(w^T @ a^T)^T``: the GEMM reads the rows of ``a`` as its columns and
        writes its columns as the rows of the output, with no transposed copy."""
        rows = np.ascontiguousarray(x.reshape(-1, x.shape[-1]))
        out = np.empty((*x.shape[:-1], self.filters), np.uint8) if outputs is None else outputs[0]
        if params[3] is not None:  # weights' zero points: through int32 products
            product = np.empty((self.filters, rows.shape[0]), np.uint8)
            _gemm(self.packed, params, np.ascontiguousarray(rows.T), product, self.workers)
            out.reshape(-1, self.filters)[...] = product.T
            return out
        _run_gemm(
            QGEMM_ROWS, self.packed, rows, rows.shape[0], params, out.reshape(-1, self.filters), self.workers
        )
        return out
