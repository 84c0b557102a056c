"""Einsum: sums of products over the axes an equation names, as numpy's einsum."""

from __future__ import annotations

import string
from collections import Counter

import attrs

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.elementwise import NUMERIC_TYPES, expect_dtype, expect_same_dtype
from flowrt.engine.graph.shapes import broadcast_shapes
from flowrt.errors import ShapeError
from flowrt.types import Dim, TensorInfo

ELLIPSIS = "..."


def _check_equation(equation: str) -> None:
    terms = equation.replace(" ", "").replace(ELLIPSIS, "").replace("->", ",")
    if not all(c in string.ascii_letters or c == "," for c in terms) or equation.count("->") > 1:
        raise ValueError(
            f"an einsum equation of letters, commas, '...' and one '->' expected, got {equation!r}"
        )


@attrs.frozen
class EinsumDescriptor:
    """Einsum: ``equation`` as numpy's, e.g. ``"bij,bjk->bik"``; without ``->`` the output has
    the broadcast ``...`` dims, then the letters used once, in alphabetical order."""

    equation: str = attrs.field(validator=lambda _, __, v: _check_equation(v))


def parse_equation(equation: str, num_inputs: int) -> tuple[list[str], str]:
    """The input terms and the output term, with the implicit output made explicit; each term
    is letters, possibly with one ``...``. ShapeError when the terms do not fit the inputs."""
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != num_inputs:
        raise ShapeError(
            f"Einsum: equation {equation!r} has {len(terms)} input terms for {num_inputs} inputs"
        )
    if not arrow:
        counts = Counter(c for t in terms for c in t.replace(ELLIPSIS, ""))
        once = "".join(sorted(c for c, n in counts.items() if n == 1))
        rhs = (ELLIPSIS if any(ELLIPSIS in t for t in terms) else "") + once
    used = set("".join(terms))
    letters = rhs.replace(ELLIPSIS, "")
    if len(set(letters)) != len(letters) or not set(letters) <= used:
        raise ShapeError(f"Einsum: output term {rhs!r} repeats a letter or uses one no input has")
    return terms, rhs


def _merge(known: Dim, new: Dim, letter: str) -> Dim:
    """One letter's dim seen twice: equal, or 1 broadcast to the other (as numpy allows)."""
    if known == new or new == 1:
        return known
    if known == 1:
        return new
    if isinstance(known, int) and isinstance(new, int):
        raise ShapeError(f"Einsum: letter {letter!r} stands for dims {known} and {new}")
    # An unknown dim is the other one or 1; two different symbolic names are unknown.
    if known is None or new is None:
        return new if known is None else known
    return None


def _term_dims(
    term: str, shape: tuple[Dim, ...] | None
) -> tuple[list[tuple[str, Dim]], tuple[Dim, ...] | None]:
    """(letter, dim) pairs of one input term and the dims its ``...`` covers (None: unknown)."""
    letters = term.replace(ELLIPSIS, "")
    if shape is None:
        return [(c, None) for c in letters], None
    extra = len(shape) - len(letters)
    if extra < 0 or (extra > 0 and ELLIPSIS not in term):
        raise ShapeError(f"Einsum: term {term!r} does not fit an input of rank {len(shape)}")
    head = term.index(ELLIPSIS) if ELLIPSIS in term else len(term)
    ellipsis_dims = shape[head : head + extra]
    rest = shape[:head] + shape[head + extra :]
    return list(zip(letters, rest, strict=True)), ellipsis_dims


@layer_kind("Einsum", EinsumDescriptor, min_inputs=1, max_inputs=None)
def infer_einsum(desc: EinsumDescriptor, inputs, consts):
    for x in inputs:
        expect_dtype(x, NUMERIC_TYPES, "each input")
    expect_same_dtype(inputs, "Einsum")
    terms, rhs = parse_equation(desc.equation, len(inputs))
    dims: dict[str, Dim] = {}
    ellipses = []
    for term, x in zip(terms, inputs, strict=True):
        pairs, ellipsis_dims = _term_dims(term, x.shape)
        for letter, d in pairs:
            dims[letter] = _merge(dims[letter], d, letter) if letter in dims else d
        if ELLIPSIS in term:
            ellipses.append(ellipsis_dims)
    ellipsis_shape = broadcast_shapes(*ellipses, where="Einsum '...' dims") if ellipses else ()
    if ellipsis_shape is None and ELLIPSIS in rhs:
        return [TensorInfo(None, inputs[0].dtype)]
    head = rhs.index(ELLIPSIS) if ELLIPSIS in rhs else len(rhs)
    letters = rhs.replace(ELLIPSIS, "")
    middle = list(ellipsis_shape) if ellipsis_shape and ELLIPSIS in rhs else []
    out = [dims[c] for c in letters[:head]] + middle
    out += [dims[c] for c in letters[head:]]
    return [TensorInfo(tuple(out), inputs[0].dtype)]
