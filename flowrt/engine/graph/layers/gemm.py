"""Matrix products: Gemm (alpha * A' B' + beta * C), MatMul with numpy's broadcasting (and
flowrt's MatMulBias and TransposedMatMul), and the quantized MatMulInteger, QLinearMatMul and
ONNX Runtime's QGemm."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from flowrt.engine.graph.layer_kind import NoDescriptor, as_tuple, layer_kind
from flowrt.engine.graph.shapes import broadcast_shapes
from flowrt.errors import DataTypeError, GraphError, ShapeError
from flowrt.types import DataType, Dim, TensorInfo

D = DataType
NUMERIC_TYPES = frozenset({D.FLOAT16, D.FLOAT32, D.FLOAT64, D.BFLOAT16, D.INT32, D.INT64, D.UINT32, D.UINT64})
INT8_TYPES = frozenset({D.INT8, D.UINT8})


@attrs.frozen
class GemmDescriptor:
    """Gemm: Y = alpha * A' @ B' + beta * C, where A' is A transposed when ``transA`` (B' likewise).
    Since opset 7 C broadcasts to (M, N); before, it did so only with ``broadcast`` set and had
    to be exactly (M, N) otherwise."""

    alpha: float = 1.0
    beta: float = 1.0
    transA: int = attrs.field(default=0, validator=attrs.validators.in_((0, 1)))
    transB: int = attrs.field(default=0, validator=attrs.validators.in_((0, 1)))
    broadcast: int = attrs.field(default=0, validator=attrs.validators.in_((0, 1)))
    opset: int = 21

    @property
    def broadcasts_c(self) -> bool:
        """Whether C may be broadcast to the product's shape."""
        return self.opset >= 7 or bool(self.broadcast)


def _known(d: Dim) -> bool:
    return isinstance(d, int)


def _same_dim(a: Dim, b: Dim) -> bool:
    """False only when both dims are known and differ."""
    return not (_known(a) and _known(b) and a != b)


def expect_types(infos: Sequence[TensorInfo], allowed: frozenset[DataType], what: str) -> None:
    """DataTypeError unless every info has one and the same data type, one of ``allowed``."""
    dtypes = [i.dtype for i in infos]
    if dtypes[0] not in allowed:
        names = ", ".join(sorted(d.name.lower() for d in allowed))
        raise DataTypeError(f"{what} expects one of {names}, got {dtypes[0].name.lower()}")
    if len(set(dtypes)) > 1:
        raise DataTypeError(
            f"{what} expects inputs of one data type, got {', '.join(d.name.lower() for d in dtypes)}"
        )


def _matrix(info: TensorInfo, transposed: int, name: str) -> tuple[Dim, Dim]:
    shape = info.shape if info.shape is not None else (None, None)
    if len(shape) != 2:
        raise ShapeError(f"Gemm expects {name} to be a matrix (rank 2), got shape {info.format_shape()}")
    return (shape[1], shape[0]) if transposed else (shape[0], shape[1])


@layer_kind("Gemm", GemmDescriptor, min_inputs=2, max_inputs=3)
def infer_gemm(desc: GemmDescriptor, inputs, consts):
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    expect_types([a, b] + ([c] if c is not None else []), NUMERIC_TYPES, "Gemm")
    m, k = _matrix(a, desc.transA, "A")
    k_b, n = _matrix(b, desc.transB, "B")
    if not _same_dim(k, k_b):
        raise ShapeError(
            f"Gemm expects A' (M, K) and B' (K, N) to share K, got A' ({m}, {k}) and B' ({k_b}, {n})"
        )
    if c is not None and c.shape is not None:
        _check_c(desc, c, (m, n))
    return [TensorInfo((m, n), a.dtype)]


def _check_c(desc: GemmDescriptor, c: TensorInfo, product: tuple[Dim, Dim]) -> None:
    expected = f"(M, N) = ({product[0]}, {product[1]})"
    assert c.shape is not None  # infer_gemm checks C where its shape is known
    if not desc.broadcasts_c:
        if len(c.shape) != 2 or not all(_same_dim(d, p) for d, p in zip(c.shape, product, strict=True)):
            raise ShapeError(
                f"Gemm (opset {desc.opset}, broadcast=0) expects C of shape {expected}, got {c.format_shape()}"
            )
        return
    dims = list(c.shape)
    if len(dims) > 2 or not all(
        d == 1 or _same_dim(d, p) for d, p in zip(dims, product[2 - len(dims) :], strict=True)
    ):
        raise ShapeError(f"Gemm expects C that broadcasts to {expected}, got {c.format_shape()}")


def matmul_shape(a: TensorInfo, b: TensorInfo, what: str) -> tuple[Dim, ...] | None:
    """The shape of numpy's matmul of ``a`` by ``b``: 1-D operands gain and then lose a dim,
    batch dims broadcast. None when either rank is unknown."""
    if a.shape is None or b.shape is None:
        return None
    if not a.shape or not b.shape:
        raise ShapeError(
            f"{what} expects operands of rank >= 1, got {a.format_shape()} and {b.format_shape()}"
        )
    a2 = (1, *a.shape) if len(a.shape) == 1 else a.shape
    b2 = (*b.shape, 1) if len(b.shape) == 1 else b.shape
    if not _same_dim(a2[-1], b2[-2]):
        raise ShapeError(
            f"{what} expects A's last dim to equal B's row count, got {a.format_shape()} and {b.format_shape()}"
        )
    batch = broadcast_shapes(a2[:-2], b2[:-2], where=what)
    assert batch is not None  # both shapes are known
    rows = (a2[-2],) if len(a.shape) > 1 else ()
    cols = (b2[-1],) if len(b.shape) > 1 else ()
    return (*batch, *rows, *cols)


@layer_kind("MatMul", NoDescriptor, min_inputs=2, max_inputs=2)
def infer_matmul(desc, inputs, consts):
    a, b = inputs
    expect_types([a, b], NUMERIC_TYPES, "MatMul")
    return [TensorInfo(matmul_shape(a, b, "MatMul"), a.dtype)]


@layer_kind("MatMulBias", NoDescriptor, min_inputs=2, max_inputs=4)
def infer_matmul_bias(desc, inputs, consts):
    """flowrt's own: ``MatMul(A, B) + bias [+ Z]`` with B a matrix, bias a vector along its
    columns (what the optimizer fuses a Linear layer on a sequence into; optional: None) and
    Z a tensor of the output's shape (a residual connection, where a backend offers that
    fusion: GpuAcc adds it in its GEMM's epilogue); float32, or float16 where a backend
    stores half (reduce_fp32_to_fp16)."""
    a, b, bias, z = (list(inputs) + [None, None])[:4]
    expect_types([t for t in (a, b, bias) if t is not None], frozenset({D.FLOAT32, D.FLOAT16}), "MatMulBias")
    if b.shape is not None and len(b.shape) != 2:
        raise ShapeError(f"MatMulBias expects B of rank 2, got {b.format_shape()}")
    if (
        bias is not None
        and bias.shape is not None
        and (len(bias.shape) != 1 or (b.shape is not None and not _same_dim(bias.shape[0], b.shape[1])))
    ):
        raise ShapeError(
            f"MatMulBias expects a bias of B's {b.shape[1] if b.shape else 'N'} columns, got {bias.format_shape()}"
        )
    shape = matmul_shape(a, b, "MatMulBias")
    if z is not None and (
        z.dtype != a.dtype or (shape is not None and z.shape is not None and tuple(z.shape) != tuple(shape))
    ):
        raise ShapeError(
            f"MatMulBias expects Z of its output's shape {shape} and type {a.dtype.value}, "
            f"got {z.format_shape()} {z.dtype.value}"
        )
    return [TensorInfo(shape, a.dtype)]


@attrs.frozen
class TransposedMatMulDescriptor:
    """TransposedMatMul: A and B are read transposed by ``perm_a`` and ``perm_b`` (None: as
    they are), as Transpose's ``perm`` would give them, their product scaled by ``alpha`` and
    written transposed by ``perm_y`` (None: as it is)."""

    perm_a: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)
    perm_b: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)
    alpha: float = 1.0
    perm_y: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)


def permuted(info: TensorInfo, perm: tuple[int, ...] | None, what: str) -> TensorInfo:
    """``info`` as Transpose by ``perm`` gives it (unchanged for None); ShapeError when
    ``perm`` is not a permutation of its dims."""
    if perm is None or info.shape is None:
        return info
    if sorted(perm) != list(range(len(info.shape))):
        raise ShapeError(f"{what} expects a permutation of 0..{len(info.shape) - 1}, got {list(perm)}")
    return TensorInfo(tuple(info.shape[p] for p in perm), info.dtype)


@layer_kind("TransposedMatMul", TransposedMatMulDescriptor, min_inputs=2, max_inputs=2)
def infer_transposed_matmul(desc, inputs, consts):
    """flowrt's own: ``Transpose(alpha * Transpose(A, perm_a) @ Transpose(B, perm_b), perm_y)``
    with numpy's matmul rules, the operands read and the result written through permuted
    strides where a backend offers that fusion (GpuAcc: attention's head splits feed its GEMMs,
    and its heads' merge takes their result, with no transpose pass)."""
    a, b = inputs
    expect_types([a, b], frozenset({D.FLOAT32, D.FLOAT16}), "TransposedMatMul")
    a, b = (
        permuted(a, desc.perm_a, "TransposedMatMul's perm_a"),
        permuted(b, desc.perm_b, "TransposedMatMul's perm_b"),
    )
    y = TensorInfo(matmul_shape(a, b, "TransposedMatMul"), a.dtype)
    return [permuted(y, desc.perm_y, "TransposedMatMul's perm_y")]


@layer_kind("MatMulInteger", NoDescriptor, min_inputs=2, max_inputs=4)
def infer_matmul_integer(desc, inputs, consts):
    a, b = inputs[0], inputs[1]
    for info, name in ((a, "A"), (b, "B")):
        if info.dtype not in INT8_TYPES:
            raise DataTypeError(
                f"MatMulInteger expects {name} of int8 or uint8, got {info.dtype.name.lower()}"
            )
    return [TensorInfo(matmul_shape(a, b, "MatMulInteger"), D.INT32)]


@layer_kind("QLinearMatMul", NoDescriptor, min_inputs=8, max_inputs=8)
def infer_qlinear_matmul(desc, inputs, consts):
    a, b, y_zero_point = inputs[0], inputs[3], inputs[7]
    for info, name in ((a, "a"), (b, "b"), (y_zero_point, "y_zero_point")):
        if info.dtype not in INT8_TYPES:
            raise DataTypeError(
                f"QLinearMatMul expects {name} of int8 or uint8, got {info.dtype.name.lower()}"
            )
    return [TensorInfo(matmul_shape(a, b, "QLinearMatMul"), y_zero_point.dtype)]


@attrs.frozen
class QGemmDescriptor:
    """ONNX Runtime's com.microsoft QGemm: ``Y = alpha * (A' - a_zp) (B' - b_zp) * a_scale *
    b_scale + C * a_scale * b_scale`` (C int32, at the product's scale), quantized with
    ``y_scale`` and ``y_zero_point`` when given, else float32. A' and B' as Gemm's."""

    alpha: float = 1.0
    transA: int = attrs.field(default=0, validator=attrs.validators.in_((0, 1)))
    transB: int = attrs.field(default=0, validator=attrs.validators.in_((0, 1)))


def _scalar_of(info: TensorInfo, what: str, dtypes: frozenset[DataType]) -> None:
    if info.dtype not in dtypes:
        names = ", ".join(sorted(d.name.lower() for d in dtypes))
        raise DataTypeError(f"QGemm expects {what} of {names}, got {info.dtype.name.lower()}")
    if info.shape is not None and info.is_static and info.num_elements != 1:
        raise ShapeError(f"QGemm expects {what} to hold one value, got shape {info.format_shape()}")


@layer_kind("QGemm", QGemmDescriptor, min_inputs=6, max_inputs=9)
def infer_qgemm(desc: QGemmDescriptor, inputs, consts):
    """Y (M, N): uint8 or int8 with ``y_zero_point``'s type when ``y_scale`` is given, else
    float32. ``b_scale`` and ``b_zero_point`` per tensor or per column of B' (N)."""
    a, a_scale, a_zero, b, b_scale, b_zero = inputs[:6]
    c, y_scale, y_zero = (list(inputs[6:]) + [None] * 3)[:3]
    for info, name in ((a, "A"), (b, "B")):
        if info.dtype not in INT8_TYPES:
            raise DataTypeError(f"QGemm expects {name} of int8 or uint8, got {info.dtype.name.lower()}")
    _scalar_of(a_scale, "a_scale", frozenset({D.FLOAT32}))
    _scalar_of(a_zero, "a_zero_point", frozenset({a.dtype}))
    if b_zero.dtype != b.dtype:
        raise DataTypeError(
            f"QGemm expects b_zero_point of B's type {b.dtype.name.lower()}, got {b_zero.dtype.name.lower()}"
        )
    if b_scale.dtype is not D.FLOAT32:
        raise DataTypeError(f"QGemm expects b_scale of float32, got {b_scale.dtype.name.lower()}")
    m, k = _matrix(a, desc.transA, "A")
    k_b, n = _matrix(b, desc.transB, "B")
    if not _same_dim(k, k_b):
        raise ShapeError(
            f"QGemm expects A' (M, K) and B' (K, N) to share K, got A' ({m}, {k}) and B' ({k_b}, {n})"
        )
    for info, name in ((b_scale, "b_scale"), (b_zero, "b_zero_point")):
        if info.shape is not None and info.is_static and info.num_elements != 1:
            if len(info.shape) != 1 or not _same_dim(info.shape[0], n):
                raise ShapeError(
                    f"QGemm expects {name} per tensor or per column of B' ({n}), got {info.format_shape()}"
                )
    if c is not None:
        if c.dtype is not D.INT32:
            raise DataTypeError(f"QGemm expects C of int32, got {c.dtype.name.lower()}")
        if c.shape is not None:
            _check_c(GemmDescriptor(), c, (m, n))
    if (y_scale is None) != (y_zero is None):
        raise GraphError("QGemm expects y_scale and y_zero_point both or neither (a float32 output)")
    if y_scale is None:
        return [TensorInfo((m, n), D.FLOAT32)]
    _scalar_of(y_scale, "y_scale", frozenset({D.FLOAT32}))
    _scalar_of(y_zero, "y_zero_point", INT8_TYPES)
    return [TensorInfo((m, n), y_zero.dtype)]
