"""Transpose, DepthToSpace and SpaceToDepth: layers that move elements between dims."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from flowrt.engine.graph.layer_kind import as_tuple, layer_kind
from flowrt.errors import ShapeError
from flowrt.types import Dim, TensorInfo


@attrs.frozen
class TransposeDescriptor:
    """Transpose: output dim i is input dim ``perm[i]``; no ``perm`` reverses the dims."""

    perm: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)


def transpose_perm(perm: tuple[int, ...] | None, rank: int) -> list[int]:
    """The permutation for a tensor of ``rank``; ShapeError when ``perm`` is not one of range(rank)."""
    if perm is None:
        return list(range(rank))[::-1]
    norm = [p + rank if p < 0 else p for p in perm]
    if sorted(norm) != list(range(rank)):
        raise ShapeError(f"Transpose: perm must be a permutation of 0..{rank - 1}, got {list(perm)}")
    return norm


def moves_data(shape: Sequence[int], perm: Sequence[int]) -> bool:
    """Whether transposing a tensor of ``shape`` by ``perm`` (normalized) moves any element:
    not when the axes longer than 1 keep their order (only axes of size 1 move), where the
    output is the input's bytes under another shape."""
    kept = [p for p in perm if shape[p] != 1]
    return kept != sorted(kept)


@layer_kind("Transpose", TransposeDescriptor)
def infer_transpose(desc: TransposeDescriptor, inputs, consts):
    data = inputs[0]
    if data.shape is None:
        return [TensorInfo(None if desc.perm is None else (None,) * len(desc.perm), data.dtype)]
    perm = transpose_perm(desc.perm, len(data.shape))
    return [TensorInfo(tuple(data.shape[p] for p in perm), data.dtype)]


@attrs.frozen
class DepthToSpaceDescriptor:
    """DepthToSpace / SpaceToDepth: blocks of ``blocksize`` x ``blocksize`` pixels move between
    channels and space; ``mode`` orders the channels depth-column-row (DCR) or column-row-depth (CRD)."""

    blocksize: int = attrs.field(validator=attrs.validators.gt(0))
    mode: str = attrs.field(default="DCR", validator=attrs.validators.in_(("DCR", "CRD")))


def _nchw(info: TensorInfo, where: str) -> tuple[Dim, Dim, Dim, Dim]:
    shape = info.shape if info.shape is not None else (None,) * 4
    if len(shape) != 4:
        raise ShapeError(f"{where}: a 4-D input (N, C, H, W) expected, got shape {info.format_shape()}")
    return shape


def _times(d: Dim, k: int) -> Dim:
    return d * k if isinstance(d, int) else None


def _divide(d: Dim, k: int, what: str, where: str) -> Dim:
    if not isinstance(d, int):
        return None
    if d % k:
        raise ShapeError(f"{where}: {what} must be divisible by {k}, got {d}")
    return d // k


@layer_kind("DepthToSpace", DepthToSpaceDescriptor)
def infer_depth_to_space(desc: DepthToSpaceDescriptor, inputs, consts):
    n, c, h, w = _nchw(inputs[0], "DepthToSpace")
    b = desc.blocksize
    shape = (n, _divide(c, b * b, "channels", "DepthToSpace"), _times(h, b), _times(w, b))
    return [TensorInfo(shape, inputs[0].dtype)]


@layer_kind("SpaceToDepth", DepthToSpaceDescriptor)
def infer_space_to_depth(desc: DepthToSpaceDescriptor, inputs, consts):
    n, c, h, w = _nchw(inputs[0], "SpaceToDepth")
    b = desc.blocksize
    shape = (
        n,
        _times(c, b * b),
        _divide(h, b, "height", "SpaceToDepth"),
        _divide(w, b, "width", "SpaceToDepth"),
    )
    return [TensorInfo(shape, inputs[0].dtype)]
