"""Attention (opsets 23 to 25): scaled dot-product attention of queries on keys and values.

Inputs are ONNX's: Q, K, V, then the optional attn_mask, past_key, past_value and (opset 24)
nonpad_kv_seqlen. Outputs are Y, present_key, present_value and qk_matmul_output; the
trailing ones may be left off the node (``num_outputs``). Q, K and V are all 4-D,
[batch, heads, sequence, head size], or all 3-D, [batch, sequence, heads * head size] cut
into ``q_num_heads`` (Q) and ``kv_num_heads`` (K, V) heads. Fewer key/value heads than query
heads is grouped-query attention: each key/value head serves ``q_heads / kv_heads``
neighbouring query heads.

:func:`attention_layout` checks the shapes against each other and gives the sizes; shape
inference calls it on the known dims, the CpuRef kernel again on the actual ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.elementwise import FLOAT_TYPES, expect_dtype, onnx_dtype_to_datatype
from flowrt.errors import DataTypeError, GraphError, ShapeError
from flowrt.types import DataType, Dim, TensorInfo

WHERE = "Attention"
Shape = tuple[Dim, ...]
# softmax_precision's ONNX type numbers: float, float16, double, bfloat16.
SOFTMAX_PRECISIONS = (1, 10, 11, 16)


def _optional_positive(instance: object, attribute: attrs.Attribute, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"{attribute.name!r} expects a number of heads >= 1, got {value!r}")


@attrs.frozen
class AttentionDescriptor:
    """Attention: ``softmax(softcap(Q K^T * scale) + bias) V``. ``scale`` (default
    1/sqrt(head size)) is applied as its square root to Q and to K, as the spec says, against
    overflow; ``softcap`` > 0 maps the scores through ``softcap * tanh(x / softcap)``. The bias
    adds a float ``attn_mask`` or -inf where a bool one is False; ``is_causal`` masks each
    query's later keys, offset by the past (``past_key``'s length, or per batch
    ``nonpad_kv_seqlen - q_sequence``); the window sizes (opset 25, -1: unbounded) mask keys
    farther than that from the query's position; ``nonpad_kv_seqlen`` masks each batch's
    padding keys. A fully masked query row gives zeros. ``softmax_precision`` (an ONNX type
    number) is the float type the softmax runs in. ``qk_matmul_output_mode`` picks what the
    fourth output holds: 0 the scaled product, 1 after the softcap, 2 after the bias too, 3 the
    softmax's probabilities (mode 0 follows the spec: onnx's reference gives the softcapped
    product there)."""

    opset: int = 25
    is_causal: int = attrs.field(default=0, validator=attrs.validators.in_((0, 1)))
    kv_num_heads: int | None = attrs.field(default=None, validator=_optional_positive)
    q_num_heads: int | None = attrs.field(default=None, validator=_optional_positive)
    qk_matmul_output_mode: int = attrs.field(default=0, validator=attrs.validators.in_((0, 1, 2, 3)))
    scale: float | None = None
    softcap: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
    softmax_precision: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(SOFTMAX_PRECISIONS))
    )
    left_window_size: int = attrs.field(default=-1, validator=attrs.validators.ge(-1))
    right_window_size: int = attrs.field(default=-1, validator=attrs.validators.ge(-1))
    num_outputs: int = attrs.field(default=1, validator=attrs.validators.in_((1, 2, 3, 4)))

    def __attrs_post_init__(self) -> None:
        if self.opset < 25 and (self.left_window_size != -1 or self.right_window_size != -1):
            raise ValueError(f"the window sizes exist from opset 25, this model is opset {self.opset}")


@attrs.frozen
class AttentionLayout:
    """The sizes of one Attention call; a dim is None (or a symbolic name) when not known."""

    rank: int
    batch: Dim
    q_heads: Dim
    kv_heads: Dim
    q_sequence: Dim
    kv_sequence: Dim
    past_sequence: Dim  # 0 without past_key
    head_size: Dim
    v_head_size: Dim

    @property
    def total_sequence(self) -> Dim:
        """Keys attended: the past ones and K's."""
        if isinstance(self.past_sequence, int) and isinstance(self.kv_sequence, int):
            return self.past_sequence + self.kv_sequence
        return self.kv_sequence if self.past_sequence == 0 else None


def _conflict(a: Dim, b: Dim) -> bool:
    return isinstance(a, int) and isinstance(b, int) and a != b


def _known(a: Dim, b: Dim) -> Dim:
    """Of two dims that must be equal, the one that says more."""
    return a if isinstance(a, int) or b is None else b


def _shown(shape: Shape) -> str:
    return TensorInfo(shape).format_shape()


def _split_heads(shape: Shape, heads: int | None, attribute: str, what: str) -> tuple[Dim, ...]:
    """[batch, heads, sequence, head size] of a 3-D ``shape`` cut into ``heads`` heads."""
    if heads is None:
        raise ShapeError(f"{WHERE}: a 3-D {what} {_shown(shape)} needs the {attribute} attribute")
    batch, sequence, hidden = shape
    if isinstance(hidden, int) and hidden % heads:
        raise ShapeError(f"{WHERE}: {what}'s hidden size {hidden} is not a multiple of {attribute} {heads}")
    return batch, heads, sequence, hidden // heads if isinstance(hidden, int) else None


def _as_heads(desc: AttentionDescriptor, q: Shape, k: Shape, v: Shape) -> tuple[tuple[Dim, ...], ...]:
    """Q, K and V each as [batch, heads, sequence, head size]."""
    if not len(q) == len(k) == len(v) or len(q) not in (3, 4):
        raise ShapeError(
            f"{WHERE}: Q, K and V all 3-D or all 4-D expected, got {_shown(q)}, {_shown(k)} and {_shown(v)}"
        )
    if len(q) == 3:
        return (
            _split_heads(q, desc.q_num_heads, "q_num_heads", "Q"),
            _split_heads(k, desc.kv_num_heads, "kv_num_heads", "K"),
            _split_heads(v, desc.kv_num_heads, "kv_num_heads", "V"),
        )
    if desc.opset >= 25 and (desc.q_num_heads is not None or desc.kv_num_heads is not None):
        raise ShapeError(f"{WHERE}: q_num_heads and kv_num_heads are for 3-D inputs only, Q is {_shown(q)}")
    for heads, given, attribute in (
        (q[1], desc.q_num_heads, "q_num_heads"),
        (k[1], desc.kv_num_heads, "kv_num_heads"),
    ):
        if given is not None and _conflict(heads, given):
            raise ShapeError(f"{WHERE}: {attribute} {given} expected as the 4-D input's dim 1, got {heads}")
    return q, k, v


def _check_kv(q4: Shape, k4: Shape, v4: Shape) -> None:
    """ShapeError unless K and V fit Q and each other."""
    if _conflict(q4[0], k4[0]) or _conflict(q4[0], v4[0]):
        raise ShapeError(f"{WHERE}: Q, K and V of one batch size expected, got {q4[0]}, {k4[0]} and {v4[0]}")
    if _conflict(k4[1], v4[1]) or _conflict(k4[2], v4[2]):
        raise ShapeError(
            f"{WHERE}: K and V of the same heads and sequence expected, got K {_shown(k4)} and V {_shown(v4)} "
            "(as [batch, heads, sequence, head size])"
        )
    if _conflict(q4[3], k4[3]):
        raise ShapeError(f"{WHERE}: Q and K of one head size expected, got {q4[3]} and {k4[3]}")
    q_heads, kv_heads = q4[1], k4[1]
    if isinstance(q_heads, int) and isinstance(kv_heads, int) and q_heads % kv_heads:
        raise ShapeError(
            f"{WHERE}: the query heads ({q_heads}) must be a multiple of the key/value heads ({kv_heads})"
        )


def _check_past(layout: AttentionLayout, past: Shape, head_size: Dim, name: str) -> Dim:
    """The past sequence length of ``past`` ([batch, kv heads, past sequence, ``head_size``])."""
    expected = (layout.batch, layout.kv_heads, None, head_size)
    if len(past) != 4 or any(_conflict(d, e) for d, e in zip(past, expected)):
        raise ShapeError(
            f"{WHERE}: {name} [batch, kv_num_heads, past_sequence, head size] of shape "
            f"{_shown(expected)} expected, got {_shown(past)}"
        )
    return past[2]


def _check_mask(layout: AttentionLayout, mask: Shape) -> None:
    """ShapeError unless ``mask`` broadcasts to [batch, q heads, q sequence, total sequence],
    its last dim at most the total (the rest is padded with masked keys)."""
    target = (layout.batch, layout.q_heads, layout.q_sequence, layout.total_sequence)
    last, total = (mask[-1], target[-1]) if mask else (1, target[-1])
    too_long = isinstance(last, int) and isinstance(total, int) and last > total
    if (
        len(mask) > 4
        or too_long
        or any(d != 1 and _conflict(d, t) for d, t in zip(mask[-2::-1], target[-2::-1]))
    ):
        raise ShapeError(
            f"{WHERE}: attn_mask broadcastable to [batch, q_num_heads, q_sequence, total_sequence] "
            f"{_shown(target)} (the last dim may be shorter) expected, got {_shown(mask)}"
        )


def attention_layout(desc: AttentionDescriptor, shapes: Sequence[Shape | None]) -> AttentionLayout:
    """The sizes of a call on inputs of ``shapes`` (Q, K, V, then the optional inputs, None
    where absent); ShapeError naming the input when they do not fit. Q, K and V's shapes
    must be given."""
    q, k, v, mask, past_key, past_value, nonpad = list(shapes) + [None] * (7 - len(shapes))
    assert q is not None and k is not None and v is not None
    q4, k4, v4 = _as_heads(desc, q, k, v)
    _check_kv(q4, k4, v4)
    layout = AttentionLayout(
        len(q), _known(q4[0], k4[0]), q4[1], _known(k4[1], v4[1]), q4[2], _known(k4[2], v4[2]), 0,
        _known(q4[3], k4[3]), v4[3],
    )  # fmt: skip
    if (past_key is None) != (past_value is None):
        raise GraphError(f"{WHERE}: past_key and past_value come together, got only one of them")
    if past_key is not None and past_value is not None:
        if nonpad is not None:
            raise GraphError(f"{WHERE}: nonpad_kv_seqlen cannot be combined with past_key and past_value")
        past = _known(
            _check_past(layout, past_key, layout.head_size, "past_key"),
            _check_past(layout, past_value, layout.v_head_size, "past_value"),
        )
        layout = attrs.evolve(layout, past_sequence=past)
    if nonpad is not None and (len(nonpad) != 1 or _conflict(nonpad[0], layout.batch)):
        raise ShapeError(
            f"{WHERE}: nonpad_kv_seqlen of shape ({layout.batch},) expected, got {_shown(nonpad)}"
        )
    if mask is not None:
        _check_mask(layout, mask)
    return layout


def _check_dtypes(desc: AttentionDescriptor, inputs: Sequence[TensorInfo | None]) -> None:
    """DataTypeError unless the inputs' types are those the spec ties together."""
    q, k, v, mask, past_key, past_value, nonpad = list(inputs) + [None] * (7 - len(inputs))
    assert q is not None and k is not None and v is not None
    expect_dtype(q, FLOAT_TYPES, f"{WHERE} input Q")
    expect_dtype(v, FLOAT_TYPES, f"{WHERE} input V")
    for info, name, like, like_name in (
        (k, "K", q, "Q"), (past_key, "past_key", q, "Q"), (past_value, "past_value", v, "V"),
    ):  # fmt: skip
        if info is not None and info.dtype != like.dtype:
            raise DataTypeError(
                f"{WHERE}: {name} of {like_name}'s type {like.dtype.name.lower()} expected, got {info.dtype.name.lower()}"
            )
    if mask is not None and mask.dtype not in (DataType.BOOL, q.dtype):
        raise DataTypeError(
            f"{WHERE}: attn_mask of type bool or Q's type {q.dtype.name.lower()} expected, got {mask.dtype.name.lower()}"
        )
    if nonpad is not None:
        expect_dtype(nonpad, frozenset({DataType.INT64}), f"{WHERE} input nonpad_kv_seqlen")
    if (
        desc.softmax_precision is not None
        and onnx_dtype_to_datatype(desc.softmax_precision) is DataType.BFLOAT16
    ):
        raise DataTypeError(f"{WHERE}: softmax_precision bfloat16 is not supported (numpy has no such type)")


@layer_kind(WHERE, AttentionDescriptor, min_inputs=3, max_inputs=7, num_outputs=None)
def infer_attention(desc: AttentionDescriptor, inputs, consts):
    if len(inputs) > 6 and inputs[6] is not None and desc.opset < 24:
        raise GraphError(
            f"{WHERE}: nonpad_kv_seqlen is an input from opset 24, this model is opset {desc.opset}"
        )
    _check_dtypes(desc, inputs)
    q, k, v = inputs[:3]
    if any(info.shape is None for info in inputs if info is not None):
        known: list[Shape | None] = [None] * 4
    else:
        n = attention_layout(desc, [None if info is None else info.shape for info in inputs])
        y: Shape = (n.batch, n.q_heads, n.q_sequence, n.v_head_size)
        if n.rank == 3:
            hidden = (
                n.q_heads * n.v_head_size
                if isinstance(n.q_heads, int) and isinstance(n.v_head_size, int)
                else None
            )
            y = (n.batch, n.q_sequence, hidden)
        total = n.total_sequence
        known = [
            y,
            (n.batch, n.kv_heads, total, n.head_size),
            (n.batch, n.kv_heads, total, n.v_head_size),
            (n.batch, n.q_heads, n.q_sequence, total),
        ]
    dtypes = (q.dtype, q.dtype, v.dtype, q.dtype)
    return [TensorInfo(shape, dtype) for shape, dtype in zip(known, dtypes)][: desc.num_outputs]
