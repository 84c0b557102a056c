"""If: runs one of two subgraphs, chosen per run by a one-element boolean condition.

Inputs are ``cond``, then the outer values either branch reads (the descriptor's
``captures``, see ``subgraph_body``); the outputs are the chosen branch's. Where the branches'
output shapes differ, the layer's are unknown in the dims they disagree on (data-dependent),
unless ``cond`` is a constant. A branch whose shapes cannot be inferred from the layer's
inputs (ONNX's function expansions write a branch per input rank, and only one fits) can
never run to its end: the layer's outputs are the other branch's, and a run that takes it
fails.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.elementwise import expect_dtype
from flowrt.engine.graph.layers.subgraph_body import (
    Body,
    capture_infos,
    captures_field,
    check_captures,
    check_same_dtype,
    merge_infos,
)
from flowrt.errors import DataTypeError, FlowrtError, ShapeError
from flowrt.types import DataType, TensorInfo

BOOL = frozenset({DataType.BOOL})


@attrs.frozen
class IfDescriptor:
    """If's branches (bodies without formal inputs, with as many outputs as the layer) and
    ``captures``, the names of the outer values they read: the layer's inputs after ``cond``."""

    then_branch: Body = attrs.field(validator=attrs.validators.instance_of(Body))
    else_branch: Body = attrs.field(validator=attrs.validators.instance_of(Body))
    captures: tuple[str, ...] = captures_field()
    num_outputs: int | None = None

    def __attrs_post_init__(self) -> None:
        for which, branch in (("then_branch", self.then_branch), ("else_branch", self.else_branch)):
            if branch.inputs:
                raise ValueError(f"{which} takes no inputs, found {list(branch.inputs)}")
        check_captures(self.subgraphs, self.captures)
        counts = {len(self.then_branch.outputs), len(self.else_branch.outputs)}
        if self.num_outputs is not None:
            counts.add(self.num_outputs)
        if len(counts) > 1:
            raise ValueError(
                f"then_branch has {len(self.then_branch.outputs)} outputs and else_branch "
                f"{len(self.else_branch.outputs)}; both must have the layer's {self.num_outputs} outputs"
            )

    @property
    def subgraphs(self) -> tuple[Body, Body]:
        """The branches, then first: what the backends load."""
        return self.then_branch, self.else_branch

    def body_inputs(self, inputs: Sequence[TensorInfo | None]) -> list[list[TensorInfo | None]]:
        """Each branch's input infos (its captures'), from the layer's input infos."""
        outer = list(inputs[1:])
        return [capture_infos(branch, self.captures, outer) for branch in self.subgraphs]


def _branch_outputs(desc: IfDescriptor, inputs) -> list[list[TensorInfo] | FlowrtError]:
    """Each branch's output infos, or the ShapeError or DataTypeError inferring them raised."""
    results: list[list[TensorInfo] | FlowrtError] = []
    for branch, infos in zip(desc.subgraphs, desc.body_inputs(inputs)):
        try:
            results.append(branch.infer(infos))
        except (ShapeError, DataTypeError) as e:
            results.append(e)
    return results


@layer_kind("If", IfDescriptor, min_inputs=1, max_inputs=None, num_outputs=None)
def infer_if(desc: IfDescriptor, inputs, consts):
    cond = inputs[0]
    expect_dtype(cond, BOOL, "If: input cond")
    if cond.num_elements not in (None, 1):
        raise ShapeError(f"If: cond must hold one element, got shape {cond.format_shape()}")
    if len(inputs) != 1 + len(desc.captures):
        raise ShapeError(
            f"If: expected cond and {len(desc.captures)} captured values ({', '.join(desc.captures)}), "
            f"got {len(inputs)} inputs"
        )
    then_infos, else_infos = _branch_outputs(desc, inputs)
    if consts[0] is not None:
        chosen = then_infos if bool(consts[0].reshape(-1)[0]) else else_infos
        then_infos = else_infos = chosen
    # A branch that cannot take these inputs never runs to its end: the other gives the infos.
    if isinstance(then_infos, FlowrtError) and isinstance(else_infos, FlowrtError):
        raise then_infos
    if isinstance(then_infos, FlowrtError) or isinstance(else_infos, FlowrtError):
        return else_infos if isinstance(then_infos, FlowrtError) else then_infos
    for i, (a, b) in enumerate(zip(then_infos, else_infos)):
        check_same_dtype(a, b, f"If: output {i} of else_branch against then_branch")
    return [merge_infos(a, b) for a, b in zip(then_infos, else_infos)]
