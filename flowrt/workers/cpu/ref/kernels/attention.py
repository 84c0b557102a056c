"""Attention kernel.

It computes in the types and in the order of onnx's reference implementation (Q's type
throughout, the softmax in ``softmax_precision``; the scale's square root cast to Q's type
and applied to Q and to K before their product; the bias built from zeros of Q's type), so
that float16 results round as there. The bias decides which rows are fully masked, as there:
those rows' probabilities are zeros, not the NaN of a softmax over nothing.
"""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.attention import AttentionDescriptor, AttentionLayout, attention_layout
from flowrt.engine.graph.layers.elementwise import onnx_dtype_to_datatype
from flowrt.workers.cpu.ref.kernels import ref_kernel


def _as_heads(x: np.ndarray, heads: int) -> np.ndarray:
    """A 3-D [batch, sequence, heads * size] input as [batch, heads, sequence, size] (a view)."""
    if x.ndim == 4:
        return x
    batch, sequence, hidden = x.shape
    return np.transpose(np.reshape(x, (batch, sequence, heads, hidden // heads)), (0, 2, 1, 3))


def _padded_mask(mask: np.ndarray, dtype: np.dtype, total: int) -> np.ndarray:
    """``mask`` as additive bias of ``dtype``: keys past its last dim, and False keys of a
    bool mask, get -inf."""
    width = total - mask.shape[-1]
    if width > 0:
        fill = False if mask.dtype == np.bool_ else -np.inf
        mask = np.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, width)], constant_values=fill)
    if mask.dtype == np.bool_:
        return np.where(mask, dtype.type(0), dtype.type(-np.inf))
    return mask


def _band(allowed_offset, q_length: int, kv_length: int, dtype: np.dtype, rule) -> np.ndarray:
    """Bias 0 where ``rule(diff)`` holds, -inf elsewhere; ``diff`` is the query's absolute
    position (its index plus the offset, a scalar or one per batch) minus the key's."""
    rows = np.arange(q_length).reshape(q_length, 1)
    cols = np.arange(kv_length).reshape(1, kv_length)
    per_batch = np.ndim(allowed_offset) > 0
    offset = np.reshape(allowed_offset, (-1, 1, 1)) if per_batch else int(allowed_offset)
    bias = np.where(rule((rows + offset) - cols), dtype.type(0), dtype.type(-np.inf))
    # One per batch: [batch, 1, q, kv], so that a 3-D mask stays [heads, q, kv].
    return bias.reshape(bias.shape[0], 1, q_length, kv_length) if per_batch else bias


def _bias(desc: AttentionDescriptor, n: AttentionLayout, dtype: np.dtype, mask, nonpad) -> np.ndarray:
    """The additive bias of the scores: mask, causal band, window and padding combined."""
    q_length, total = n.q_sequence, n.total_sequence
    assert isinstance(q_length, int) and isinstance(total, int)
    bias = np.zeros((q_length, total), dtype=dtype)
    if mask is not None:
        bias = bias + _padded_mask(mask, dtype, total)
    # The keys before this query block: the past's, or (external cache) each batch's valid
    # keys less the queries.
    offset = n.past_sequence if nonpad is None else nonpad.reshape(-1) - q_length
    if desc.is_causal:
        bias = bias + _band(offset, q_length, total, dtype, lambda diff: diff >= 0)
    left, right = desc.left_window_size, desc.right_window_size
    if left >= 0 or right >= 0:
        bias = bias + _band(
            offset,
            q_length,
            total,
            dtype,
            lambda diff: (left < 0 or diff <= left) & (right < 0 or -diff <= right),
        )
    if nonpad is not None:
        valid = np.arange(total) < nonpad[:, np.newaxis]
        bias = bias + np.where(valid, 0, -np.inf).astype(dtype).reshape(-1, 1, 1, total)
    return bias


def _softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; a row of -inf only gives zeros."""
    x_max = np.max(x, axis=-1, keepdims=True)
    zero, one = np.zeros((), dtype=x.dtype), np.ones((), dtype=x.dtype)
    e = np.exp(x - np.where(np.isneginf(x_max), zero, x_max))
    total = np.sum(e, axis=-1, keepdims=True)
    return e / np.where(total == zero, one, total)


def _scores(desc: AttentionDescriptor, q: np.ndarray, k: np.ndarray, head_size: int):
    """(Q K^T scaled, the same after the softcap)."""
    scale = desc.scale if desc.scale is not None else 1 / np.sqrt(head_size)
    root = q.dtype.type(np.sqrt(scale))
    product = np.matmul(q * root, np.transpose(k, (0, 1, 3, 2)) * root).astype(q.dtype, copy=False)
    if desc.softcap > 0:
        return product, np.tanh(product / desc.softcap) * desc.softcap
    return product, product


@ref_kernel("Attention")
def attention(desc, q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None):
    shapes = [
        None if x is None else x.shape for x in (q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen)
    ]
    n = attention_layout(desc, shapes)
    q4 = _as_heads(q, n.q_heads)
    present_key, present_value = _as_heads(k, n.kv_heads), _as_heads(v, n.kv_heads)
    if past_key is not None:
        present_key = np.concatenate((past_key, present_key), axis=2)
        present_value = np.concatenate((past_value, present_value), axis=2)
    bias = _bias(desc, n, q.dtype, attn_mask, nonpad_kv_seqlen)
    # Grouped-query: each key/value head serves q_heads / kv_heads neighbouring query heads.
    group = n.q_heads // n.kv_heads
    keys, values = np.repeat(present_key, group, axis=1), np.repeat(present_value, group, axis=1)
    product, capped = _scores(desc, q4, keys, n.head_size)
    with_bias = scores = capped + bias
    if desc.softmax_precision is not None:
        scores = with_bias.astype(onnx_dtype_to_datatype(desc.softmax_precision).numpy)
    # Rows with no attendable key, decided on the bias (a score may be NaN or inf there).
    fully_masked = np.isneginf(np.max(bias, axis=-1, keepdims=True))
    probabilities = np.where(fully_masked, np.zeros((), scores.dtype), _softmax(scores))
    qk_output = (product, capped, with_bias, probabilities)[desc.qk_matmul_output_mode]
    y = np.matmul(probabilities.astype(q.dtype), values).astype(q.dtype, copy=False)
    if q.ndim == 3:
        y = np.transpose(y, (0, 2, 1, 3)).reshape(y.shape[0], y.shape[2], -1)
    return y, present_key, present_value, qk_output.astype(q.dtype)
