"""RotaryEmbedding (opset 23): rotary position embedding of attention's queries or keys; and
flowrt's ApplyRotary, the same rotation as exported models write it out."""

from __future__ import annotations

import attrs

from flowrt.engine.graph.layer_kind import as_tuple, layer_kind
from flowrt.engine.graph.layers.detection import expect_dims
from flowrt.engine.graph.layers.elementwise import expect_dtype
from flowrt.engine.graph.layers.gemm import permuted
from flowrt.engine.graph.shapes import broadcasts_to
from flowrt.errors import DataTypeError, ShapeError
from flowrt.types import DataType, Dim, TensorInfo

_TYPES = frozenset({DataType.FLOAT32, DataType.FLOAT16, DataType.BFLOAT16})


@attrs.frozen
class RotaryEmbeddingDescriptor:
    """RotaryEmbedding: rotates pairs of each head's first ``rotary_embedding_dim`` values
    (0: all of them) by angles whose cosines and sines come from the caches, picked by
    ``position_ids`` when given. A pair is two neighbours (``interleaved`` 1) or a value of
    the first half and its counterpart in the second (0). The input is [batch, heads,
    sequence, head_size], or [batch, sequence, hidden] cut into ``num_heads`` heads (which a
    4-D input ignores, as onnx's reference and ONNX Runtime do)."""

    interleaved: int = attrs.field(default=0, validator=attrs.validators.in_((0, 1)))
    rotary_embedding_dim: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    num_heads: int = attrs.field(default=0, validator=attrs.validators.ge(0))


def rotary_layout(desc: RotaryEmbeddingDescriptor, shape: tuple[Dim, ...]) -> tuple[Dim, Dim, Dim, Dim]:
    """(batch, sequence, head_size, rotated dims) of an input of ``shape``; ShapeError when the
    rank, the heads or the rotated dims do not fit."""
    where = "RotaryEmbedding"
    if len(shape) == 4:
        batch, _, sequence, head_size = shape
    elif len(shape) == 3:
        batch, sequence, hidden = shape
        if desc.num_heads == 0:
            raise ShapeError(
                f"{where}: a 3-D input {TensorInfo(shape).format_shape()} needs the num_heads attribute"
            )
        if isinstance(hidden, int) and hidden % desc.num_heads:
            raise ShapeError(f"{where}: hidden size {hidden} is not a multiple of num_heads {desc.num_heads}")
        head_size = hidden // desc.num_heads if isinstance(hidden, int) else None
    else:
        raise ShapeError(f"{where}: a 3-D or 4-D input expected, got {TensorInfo(shape).format_shape()}")
    rotated = desc.rotary_embedding_dim or head_size
    if isinstance(rotated, int) and rotated % 2:
        raise ShapeError(f"{where}: an even number of rotated dims expected, got {rotated}")
    if desc.rotary_embedding_dim and isinstance(head_size, int) and desc.rotary_embedding_dim > head_size:
        raise ShapeError(
            f"{where}: rotary_embedding_dim {desc.rotary_embedding_dim} exceeds the head size {head_size}"
        )
    return batch, sequence, head_size, rotated


@layer_kind("RotaryEmbedding", RotaryEmbeddingDescriptor, min_inputs=3, max_inputs=4)
def infer_rotary_embedding(desc: RotaryEmbeddingDescriptor, inputs, consts):
    where = "RotaryEmbedding"
    x, cos, sin = inputs[:3]
    position_ids = inputs[3] if len(inputs) > 3 else None
    expect_dtype(x, _TYPES, f"{where} input")
    for info, name in ((cos, "cos_cache"), (sin, "sin_cache")):
        if info.dtype != x.dtype:
            raise DataTypeError(
                f"{where}: {name} of the input's type {x.dtype.name.lower()} expected, got {info.dtype.name.lower()}"
            )
    if x.shape is None:
        return [x]
    batch, sequence, _, rotated = rotary_layout(desc, x.shape)
    half = rotated // 2 if isinstance(rotated, int) else None
    cache_dims: tuple[Dim, ...] = (batch, sequence, half)
    what = "[batch, sequence, rotated dims / 2] (without position_ids)"
    if position_ids is not None:
        expect_dtype(position_ids, frozenset({DataType.INT64}), f"{where} input position_ids")
        expect_dims(position_ids, (batch, sequence), "position_ids [batch, sequence]", where)
        cache_dims, what = (None, half), "[max_position + 1, rotated dims / 2] (with position_ids)"
    for info, name in ((cos, "cos_cache"), (sin, "sin_cache")):
        expect_dims(info, cache_dims, f"{name} {what}", where)
    if cos.shape is not None and sin.shape is not None:
        expect_dims(sin, cos.shape, "sin_cache (as cos_cache)", where)
    return [x]


@attrs.frozen
class ApplyRotaryDescriptor:
    """ApplyRotary: X is read transposed by ``perm`` (None: as it is), as Transpose's ``perm``
    would give it."""

    perm: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)


@layer_kind("ApplyRotary", ApplyRotaryDescriptor, min_inputs=3, max_inputs=3)
def infer_apply_rotary(desc, inputs, consts):
    """flowrt's own: ``X * cos + rotate_half(X) * sin`` of X transposed by ``perm``,
    ``rotate_half(X)`` being
    ``concat(-X[..., D/2:], X[..., :D/2])`` along X's last axis of D values (even), cos and
    sin broadcast to X's shape: rotary position embedding as Hugging Face's LLaMA applies it,
    which exporters write as Slice, Neg, Concat, Mul, Mul and Add (what the optimizer fuses
    into it, where a backend offers that fusion)."""
    x, cos, sin = inputs
    where = "ApplyRotary"
    expect_dtype(x, frozenset({DataType.FLOAT32, DataType.FLOAT16}), where)
    x = permuted(x, desc.perm, "ApplyRotary's perm")
    shape = x.shape
    if shape is not None and (not shape or (isinstance(shape[-1], int) and shape[-1] % 2)):
        raise ShapeError(f"{where} expects X whose last dim is even, got {x.format_shape()}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dtype != x.dtype:
            raise DataTypeError(f"{where} expects {name} of X's type {x.dtype.value}, got {t.dtype.value}")
        if shape is not None and t.shape is not None and not broadcasts_to(t.shape, shape):
            raise ShapeError(
                f"{where} expects {name} that broadcasts to X's shape {x.format_shape()}, got {t.format_shape()}"
            )
    return [TensorInfo(shape, x.dtype)]
