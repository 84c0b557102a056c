"""RotaryEmbedding and ApplyRotary kernels."""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.rotary import rotary_layout
from flowrt.errors import ShapeError
from flowrt.workers.cpu.ref.kernels import ref_kernel


def _angles(cos_cache, sin_cache, position_ids, batch: int, sequence: int, half: int):
    """The caches as [batch, sequence, rotated / 2], looked up by position when given;
    ShapeError when they or the positions do not fit."""
    if position_ids is not None:
        positions = cos_cache.shape[0]
        if position_ids.size and (position_ids.min() < 0 or position_ids.max() >= positions):
            raise ShapeError(
                f"RotaryEmbedding: position_ids must be in [0, {positions}) (the cache's rows), "
                f"got values from {position_ids.min()} to {position_ids.max()}"
            )
        cos_cache, sin_cache = cos_cache[position_ids], sin_cache[position_ids]
    expected = (batch, sequence, half)
    if cos_cache.shape != expected or sin_cache.shape != expected:
        raise ShapeError(
            f"RotaryEmbedding: cos and sin of shape {expected} (after the position lookup) expected, "
            f"got {cos_cache.shape} and {sin_cache.shape}"
        )
    return cos_cache, sin_cache


@ref_kernel("RotaryEmbedding")
def rotary_embedding(desc, x, cos_cache, sin_cache, position_ids=None):
    batch, sequence, head_size, rotated = rotary_layout(desc, x.shape)
    half = rotated // 2
    cos, sin = _angles(cos_cache, sin_cache, position_ids, batch, sequence, half)
    if x.ndim == 4:  # [batch, heads, sequence, head_size]: the angles broadcast over heads
        out = x.copy()
        cos, sin = cos[:, None], sin[:, None]
    else:  # [batch, sequence, hidden] seen as [batch, sequence, heads, head_size]
        out = x.reshape(batch, sequence, -1, head_size).copy()
        cos, sin = cos[:, :, None], sin[:, :, None]
    to_rotate = out[..., :rotated]
    if desc.interleaved:
        first, second = to_rotate[..., 0::2], to_rotate[..., 1::2]
    else:
        first, second = to_rotate[..., :half], to_rotate[..., half:]
    # Both from the unrotated values: compute before writing back.
    real, imaginary = cos * first - sin * second, sin * first + cos * second
    first[...], second[...] = real, imaginary
    return out.reshape(x.shape)


@ref_kernel("ApplyRotary")
def apply_rotary(desc, x, cos, sin):
    """X * cos + rotate_half(X) * sin, rotate_half(X) = concat(-X[..., D/2:], X[..., :D/2]),
    X transposed by the descriptor's perm first."""
    if desc is not None and desc.perm is not None:
        x = np.transpose(x, desc.perm)
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x * cos + rotated * sin).astype(x.dtype, copy=False)
