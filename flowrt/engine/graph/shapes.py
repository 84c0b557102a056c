"""Shape arithmetic shared by the shape inference of layer kinds."""

from __future__ import annotations

from collections.abc import Sequence

from flowrt.errors import ShapeError
from flowrt.types import Dim


def broadcast_shapes(*shapes: Sequence[Dim] | None, where: str = "") -> tuple[Dim, ...] | None:
    """Numpy-style broadcast of shapes whose dims may be unknown (None) or symbolic (str).

    Returns None when a shape's rank is unknown; raises ShapeError naming ``where`` when two
    known dims disagree.
    """
    known_shapes = [s for s in shapes if s is not None]
    if len(known_shapes) < len(shapes):
        return None
    rank = max((len(s) for s in known_shapes), default=0)
    out: list[Dim] = []
    for axis in range(rank):
        dims = [s[len(s) - rank + axis] for s in known_shapes if len(s) - rank + axis >= 0]
        known = {d for d in dims if isinstance(d, int) and d != 1}
        if len(known) > 1:
            found = " and ".join(str(tuple(s)) for s in known_shapes)
            raise ShapeError(f"{where}: shapes {found} cannot be broadcast together")
        if known:
            out.append(known.pop())
        elif all(d == 1 for d in dims):
            out.append(1)
        else:
            symbolic = [d for d in dims if d != 1]
            out.append(symbolic[0] if len(set(symbolic)) == 1 else None)
    return tuple(out)


def broadcasts_to(shape: Sequence[Dim], target: Sequence[Dim]) -> bool:
    """Whether ``shape`` broadcasts to ``target`` unchanged (numpy's rule one way: dims of 1 or
    equal, from the right); a dim not known statically is taken as fitting."""
    return len(shape) <= len(target) and all(
        not isinstance(d, int) or not isinstance(t, int) or d in (1, t)
        for d, t in zip(reversed(shape), reversed(target), strict=False)
    )


def normalize_axis(axis: int, rank: int, where: str = "") -> int:
    """An axis in [-rank, rank) made non-negative; ShapeError when out of range."""
    if not -rank <= axis < rank:
        raise ShapeError(f"{where}: axis {axis} is out of range for rank {rank}")
    return axis % rank
