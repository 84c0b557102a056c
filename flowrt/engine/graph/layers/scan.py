"""Scan: runs a body once per slice of its scan inputs, carrying state values from one
iteration to the next and stacking per-iteration outputs.

Opset 9 and later: inputs are the N initial states, then the M scan inputs
(``num_scan_inputs``), each sliced along its ``scan_input_axes`` axis (default 0), read
backwards where ``scan_input_directions`` is 1; then the outer values the body reads
(``captures``, see ``subgraph_body``). The body takes (N states, M slices) and gives (N states,
K scan outputs). The layer's outputs are the N final states, then the K scan outputs, each its
iterations' values stacked along a new axis ``scan_output_axes`` (default 0), last iteration
first where ``scan_output_directions`` is 1. Every scan input has the same length along its
axis: the number of iterations.

Opset 8's form has a batch axis first on every input and output: inputs are the optional
``sequence_lens`` (int64, one per batch entry; absent: every entry runs the whole sequence),
states of shape (batch, ...) and scan inputs of shape (batch, sequence, ...); each batch entry
is scanned along axis 1, read backwards where ``directions`` is 1. An entry shorter than the
sequence leaves its scan outputs 0 past its length.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from flowrt.engine.graph.layer_kind import as_tuple, layer_kind
from flowrt.engine.graph.layers.elementwise import expect_dtype
from flowrt.engine.graph.layers.subgraph_body import (
    Body,
    captures_field,
    check_captures,
    stable_infos,
    stacked_info,
)
from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import ShapeError
from flowrt.types import DataType, TensorInfo

INT64 = frozenset({DataType.INT64})


def _directions(instance: object, attribute: attrs.Attribute, value: tuple[int, ...] | None) -> None:
    if value is not None and any(v not in (0, 1) for v in value):
        raise ValueError(f"{attribute.name!r} expects 0 (forward) or 1 (reverse) for each value, got {value}")


@attrs.frozen
class ScanDescriptor:
    """Scan's ``body``, its attributes (see the module doc; ``directions`` is opset 8's) and
    ``captures``, the names of the outer values the body reads (the layer's last inputs)."""

    body: Body = attrs.field(validator=attrs.validators.instance_of(Body))
    num_scan_inputs: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    scan_input_axes: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)
    scan_input_directions: tuple[int, ...] | None = attrs.field(
        default=None, converter=as_tuple, validator=_directions
    )
    scan_output_axes: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple)
    scan_output_directions: tuple[int, ...] | None = attrs.field(
        default=None, converter=as_tuple, validator=_directions
    )
    directions: tuple[int, ...] | None = attrs.field(default=None, converter=as_tuple, validator=_directions)
    captures: tuple[str, ...] = captures_field()
    opset: int = 9
    num_outputs: int | None = None

    def __attrs_post_init__(self) -> None:
        inputs, outputs = len(self.body.inputs), len(self.body.outputs)
        if inputs < self.num_scan_inputs or outputs < self.num_states:
            raise ValueError(
                f"the body must take (N states, {self.num_scan_inputs} scan slices) and give (N states, "
                f"scan outputs); it takes {inputs} inputs and gives {outputs} outputs"
            )
        if self.num_outputs is not None and self.num_outputs != outputs:
            raise ValueError(f"the body gives {outputs} outputs, the node has {self.num_outputs}")
        batched = self.opset < 9
        for name, count, wrong_form in (
            ("scan_input_axes", self.num_scan_inputs, batched),
            ("scan_input_directions", self.num_scan_inputs, batched),
            ("scan_output_axes", self.num_scans, batched),
            ("scan_output_directions", self.num_scans, batched),
            ("directions", self.num_scan_inputs, not batched),
        ):
            value = getattr(self, name)
            if value is not None and wrong_form:
                raise ValueError(f"{name!r} is not an attribute of Scan in opset {self.opset}, got {value}")
            if value is not None and len(value) != count:
                raise ValueError(f"{name!r} expects {count} values, got {value}")
        check_captures(self.subgraphs, self.captures)

    @property
    def num_states(self) -> int:
        """N: the state values carried from one iteration to the next."""
        return len(self.body.inputs) - self.num_scan_inputs

    @property
    def num_scans(self) -> int:
        """K: the outputs stacked over the iterations."""
        return len(self.body.outputs) - self.num_states

    @property
    def subgraphs(self) -> tuple[Body]:
        """The body: what the backends load."""
        return (self.body,)

    @property
    def first_state(self) -> int:
        """The layer input of the first state: 1 in opset 8 (after ``sequence_lens``), else 0."""
        return 1 if self.opset < 9 else 0

    def input_setting(self, index: int) -> tuple[int, int]:
        """(axis, direction) of scan input ``index`` (opset 9's attributes, their defaults 0)."""
        axes = self.scan_input_axes or (0,) * self.num_scan_inputs
        directions = self.scan_input_directions or self.directions or (0,) * self.num_scan_inputs
        return axes[index], directions[index]

    def output_setting(self, index: int) -> tuple[int, int]:
        """(axis, direction) of scan output ``index`` (their defaults 0)."""
        axes = self.scan_output_axes or (0,) * self.num_scans
        directions = self.scan_output_directions or (0,) * self.num_scans
        return axes[index], directions[index]

    def body_inputs(self, inputs: Sequence[TensorInfo | None]) -> list[list[TensorInfo | None]]:
        """The body's input infos from the layer's: states with the dims that hold in every
        iteration (see ``stable_infos``), then one slice of each scan input, then captures."""
        return [_stable(self, inputs)[0]]


def _without(info: TensorInfo, axes: Sequence[int], what: str) -> TensorInfo:
    """``info`` without the dims at ``axes`` (non-negative); ShapeError when it has fewer."""
    if info.shape is None:
        return info
    if len(info.shape) <= max(axes):
        raise ShapeError(f"Scan: {what} needs more than {max(axes)} dims, got {info}")
    return TensorInfo(tuple(d for a, d in enumerate(info.shape) if a not in axes), info.dtype)


def _split(desc: ScanDescriptor, inputs: Sequence[TensorInfo | None]):
    """(states, slices, captures, sequence length, batch) of the layer's input infos: states
    and slices as the body sees them (opset 8's batch axis dropped)."""
    first, n, m = desc.first_state, desc.num_states, desc.num_scan_inputs
    given = [i for i in inputs[first : first + n + m] if i is not None]
    if len(inputs) != first + n + m + len(desc.captures) or len(given) != n + m:
        raise ShapeError(
            f"Scan: expected {'sequence_lens, ' if first else ''}{n} states, {m} scan inputs and "
            f"{len(desc.captures)} captured values ({', '.join(desc.captures)}), got {len(inputs)} inputs"
        )
    states = [_without(s, (0,), f"state {i}") if first else s for i, s in enumerate(given[:n])]
    slices, lengths = [], []
    for j, info in enumerate(given[n:]):
        axis = 1
        if not first and info.shape is not None:
            axis = normalize_axis(desc.input_setting(j)[0], len(info.shape), f"Scan: scan input {j}")
        slices.append(_without(info, (0, axis) if first else (axis,), f"scan input {j}"))
        lengths.append(info.shape[axis] if info.shape is not None else None)
    known = {d for d in lengths if isinstance(d, int)}
    if len(known) > 1:
        raise ShapeError(f"Scan: the scan inputs must have one length along their axes, got {sorted(known)}")
    length = known.pop() if known else (lengths[0] if len(set(lengths)) == 1 else None)
    batches = {i.shape[0] for i in given if i.shape} if first else set()
    batch = batches.pop() if len(batches) == 1 else None
    by_name = dict(zip(desc.captures, inputs[first + n + m :]))
    return states, slices, [by_name[name] for name in desc.body.captures], length, batch


def _stable(desc: ScanDescriptor, inputs: Sequence[TensorInfo | None]):
    """(the body's input infos, its output infos for them, sequence length, batch)."""
    states, slices, outer, length, batch = _split(desc, inputs)
    last: list[TensorInfo] = []

    def step(carried: list[TensorInfo]) -> list[TensorInfo]:
        last[:] = desc.body.infer([*carried, *slices, *outer])
        return last

    carried, _ = stable_infos(states, step, "Scan: state")
    return [*carried, *slices, *outer], last, length, batch


@layer_kind("Scan", ScanDescriptor, min_inputs=0, max_inputs=None, num_outputs=None)
def infer_scan(desc: ScanDescriptor, inputs, consts):
    if desc.first_state and inputs and inputs[0] is not None:
        expect_dtype(inputs[0], INT64, "Scan: input sequence_lens")
    body_inputs, outputs, length, batch = _stable(desc, inputs)
    n = desc.num_states
    states, scans = body_inputs[:n], outputs[n:]
    if desc.first_state:  # opset 8: (batch, ...) states, (batch, sequence, ...) scan outputs
        return [
            *(stacked_info(s, batch, 0) for s in states),
            *(stacked_info(stacked_info(s, length, 0), batch, 0) for s in scans),
        ]
    stacked = []
    for k, info in enumerate(scans):
        axis = desc.output_setting(k)[0]
        if info.shape is not None:
            axis = normalize_axis(axis, len(info.shape) + 1, f"Scan: scan output {k}")
        stacked.append(stacked_info(info, length, axis) if info.shape is not None else info)
    return [*states, *stacked]
