"""Loop: runs a body while an iteration count and a condition allow, carrying values from
one iteration to the next and stacking per-iteration outputs.

Inputs are ONNX's: ``M`` (the most iterations, int64; absent: no limit) and ``cond`` (bool;
absent: true), both optional, then the N initial carried values, then the outer values the
body reads (``captures``, see ``subgraph_body``). The body takes (iteration number, condition,
N carried values) and gives (condition, N carried values, K scan outputs). The layer's
outputs are the N final carried values, then the K scan outputs, each its iterations' values
stacked along a new first axis (onnxruntime's layout; with no iteration it holds none, its
other dims those inferred, 0 where unknown). The number of iterations depends on the data,
so the scan outputs' first dim is unknown, and a carried value's dims are unknown where an
iteration may change them.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.elementwise import expect_dtype
from flowrt.engine.graph.layers.subgraph_body import (
    Body,
    captures_field,
    check_captures,
    scalar_info,
    stable_infos,
    stacked_info,
)
from flowrt.errors import DataTypeError, FlowrtError, ShapeError
from flowrt.types import DataType, TensorInfo

INT64 = frozenset({DataType.INT64})
BOOL = frozenset({DataType.BOOL})


@attrs.frozen
class LoopDescriptor:
    """Loop's ``body`` and ``captures``, the names of the outer values it reads (the layer's
    inputs after the carried values)."""

    body: Body = attrs.field(validator=attrs.validators.instance_of(Body))
    captures: tuple[str, ...] = captures_field()
    num_outputs: int | None = None

    def __attrs_post_init__(self) -> None:
        inputs, outputs = len(self.body.inputs), len(self.body.outputs)
        if inputs < 2 or outputs < inputs - 1:
            raise ValueError(
                "the body must take (iteration number, condition, N carried values) and give "
                f"(condition, N carried values, scan outputs); it takes {inputs} inputs and gives {outputs} outputs"
            )
        if self.num_outputs is not None and self.num_outputs != outputs - 1:
            raise ValueError(
                f"the body gives {self.num_carried} carried values and {self.num_scans} scan outputs, "
                f"so the layer has {outputs - 1} outputs; the node has {self.num_outputs}"
            )
        check_captures(self.subgraphs, self.captures)

    @property
    def num_carried(self) -> int:
        """N: the values carried from one iteration to the next."""
        return len(self.body.inputs) - 2

    @property
    def num_scans(self) -> int:
        """K: the outputs stacked over the iterations."""
        return len(self.body.outputs) - 1 - self.num_carried

    @property
    def subgraphs(self) -> tuple[Body]:
        """The body: what the backends load."""
        return (self.body,)

    def counters(self) -> list[TensorInfo]:
        """The infos of the iteration number and the condition the body is fed."""
        return [
            scalar_info(DataType.INT64, self.body.rank_of(0)),
            scalar_info(DataType.BOOL, self.body.rank_of(1)),
        ]

    def body_inputs(self, inputs: Sequence[TensorInfo | None]) -> list[list[TensorInfo | None]]:
        """The body's input infos from the layer's: carried values with the dims that hold in
        every iteration (see ``stable_infos``)."""
        return [self._stable(inputs)[0]]

    def empty_outputs(
        self, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]
    ) -> list[TensorInfo]:
        """The layer's outputs when no iteration runs, as onnxruntime shapes them (``inputs``
        and ``outputs`` the layer's infos): a scan output has 0 rows of the shape the body
        declares for it, else of the shape onnx infers for it, not knowing the carried
        values' shapes (see ``subgraphs.empty_output`` for the dims neither gives)."""
        n = self.num_carried
        loose = [TensorInfo(None, i.dtype) if i is not None else None for i in inputs[2 : 2 + n]]
        by_name = dict(zip(self.captures, inputs[2 + n :]))
        try:
            inferred = self.body.infer([*self.counters(), *loose, *(by_name[c] for c in self.body.captures)])
        except FlowrtError:  # a body onnx infers nothing of: onnxruntime's rows have rank 1
            inferred = [TensorInfo(None)] * len(self.body.outputs)
        empty = list(outputs[:n])
        for k, output in enumerate(outputs[n:]):
            guess, declared = inferred[1 + n + k].shape, self.body.declared_shape(1 + n + k)
            shape = declared if declared is not None else guess
            if declared is not None and guess is not None and len(guess) == len(declared):
                shape = tuple(d if isinstance(d, int) else g for d, g in zip(declared, guess))
            empty.append(TensorInfo((0,) if shape is None else (0, *shape), output.dtype))
        return empty

    def _stable(self, inputs: Sequence[TensorInfo | None]) -> tuple[list, list[TensorInfo]]:
        """(the body's input infos, its output infos for them: condition, carried, scans)."""
        n = self.num_carried
        initial = list(inputs[2 : 2 + n])
        if len(inputs) != 2 + n + len(self.captures) or any(i is None for i in initial):
            raise ShapeError(
                f"Loop: expected M, cond, {n} carried values and {len(self.captures)} captured values "
                f"({', '.join(self.captures)}), got {len(inputs)} inputs with "
                f"{sum(i is not None for i in initial)} carried values"
            )
        by_name = dict(zip(self.captures, inputs[2 + n :]))
        outer = [by_name[name] for name in self.body.captures]
        counters = self.counters()
        last: list[TensorInfo] = []

        def step(carried: list[TensorInfo]) -> list[TensorInfo]:
            last[:] = self.body.infer([*counters, *carried, *outer])
            return last[1:]

        carried, _ = stable_infos(initial, step, "Loop: carried value")  # type: ignore[arg-type]  # checked above
        return [*counters, *carried, *outer], last


@layer_kind("Loop", LoopDescriptor, min_inputs=0, max_inputs=None, num_outputs=None)
def infer_loop(desc: LoopDescriptor, inputs, consts):
    for index, name, allowed in ((0, "M", INT64), (1, "cond", BOOL)):
        info = inputs[index] if index < len(inputs) else None
        if info is not None:
            expect_dtype(info, allowed, f"Loop: input {name}")
            if info.num_elements not in (None, 1):
                raise ShapeError(f"Loop: {name} must hold one element, got shape {info.format_shape()}")
    body_inputs, outputs = desc._stable(inputs)
    condition = outputs[0]
    if condition.dtype != DataType.BOOL or condition.num_elements not in (None, 1):
        raise DataTypeError(f"Loop: the body's first output is the condition, one bool; it gives {condition}")
    carried = body_inputs[2 : 2 + desc.num_carried]
    return [*carried, *(stacked_info(info, None, 0) for info in outputs[1 + desc.num_carried :])]
