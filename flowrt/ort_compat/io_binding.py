"""ONNX Runtime's ``IOBinding``: inputs read in place and outputs written into caller arrays,
for ``InferenceSession.run_with_iobinding``. flowrt binds host memory only ("cpu")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from flowrt.errors import InputError
from flowrt.ort_compat.ortvalue import OrtValue, array_at, check_cpu
from flowrt.validate import argument_error, check_instance

if TYPE_CHECKING:
    from flowrt.session import InferenceSession

_WHERE = "IOBinding"


class IOBinding:
    """Inputs and outputs bound to a session's run: made by ``session.io_binding()``.

    An output bound to an array (``bind_output`` with a ``buffer_ptr``, or
    ``bind_ortvalue_output``) is written into it by each run; one bound by name only gets a
    new array per run. ``get_outputs`` returns the last run's outputs as OrtValues, in the
    order they were bound.
    """

    def __init__(self, session: InferenceSession) -> None:
        self.session = session
        self.inputs: dict[str, Any] = {}
        self.outputs: dict[str, np.ndarray | None] = {}
        self._results: list[OrtValue] = []

    def bind_cpu_input(self, name: str, arr_on_cpu: Any) -> None:
        """Bind input ``name`` to an array, read in place by each run (keep it alive)."""
        self.inputs[self._name(name)] = arr_on_cpu

    def bind_input(
        self,
        name: str,
        device_type: str,
        device_id: int,
        element_type: Any,
        shape: Sequence[int],
        buffer_ptr: int,
    ) -> None:
        """Bind input ``name`` to ``shape`` elements of ``element_type`` at ``buffer_ptr``."""
        where = f"{_WHERE}.bind_input"
        check_cpu(device_type, device_id, where)
        self.inputs[self._name(name)] = array_at(buffer_ptr, element_type, shape, where)

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        check_instance(
            "ortvalue", ortvalue, OrtValue, "a flowrt.OrtValue", where=f"{_WHERE}.bind_ortvalue_input"
        )
        self.inputs[self._name(name)] = ortvalue.numpy()

    def bind_output(
        self,
        name: str,
        device_type: str = "cpu",
        device_id: int = 0,
        element_type: Any = None,
        shape: Sequence[int] | None = None,
        buffer_ptr: int | None = None,
    ) -> None:
        """Bind output ``name``: into the memory at ``buffer_ptr`` (``element_type`` and
        ``shape`` then required, as ONNX Runtime requires them), or, without one, to a new
        array per run."""
        where = f"{_WHERE}.bind_output"
        check_cpu(device_type, device_id, where)
        name = self._name(name)
        if buffer_ptr is None:
            self.outputs[name] = None
            return
        if element_type is None or shape is None:
            raise argument_error(
                "element_type and shape", "given with a buffer_ptr", (element_type, shape), where
            )
        self.outputs[name] = array_at(buffer_ptr, element_type, shape, where)

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        """Bind output ``name`` to ``ortvalue``'s array: each run writes into it."""
        check_instance(
            "ortvalue", ortvalue, OrtValue, "a flowrt.OrtValue", where=f"{_WHERE}.bind_ortvalue_output"
        )
        self.outputs[self._name(name)] = ortvalue.numpy()

    def _name(self, name: Any) -> str:
        return check_instance("name", name, str, "an input or output name (str)", where=_WHERE)

    def synchronize_inputs(self) -> None:
        """Nothing to wait for: bound memory is host memory."""

    def synchronize_outputs(self) -> None:
        """Nothing to wait for: a run's outputs are written when ``run_with_iobinding`` returns."""

    def get_outputs(self) -> list[OrtValue]:
        """The last run's outputs, in binding order; a bound array's OrtValue wraps that array."""
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        """Copies of the last run's outputs (as ONNX Runtime's: they outlive bound memory)."""
        return [value.numpy().copy() for value in self._results]

    def clear_binding_inputs(self) -> None:
        self.inputs.clear()

    def clear_binding_outputs(self) -> None:
        self.outputs.clear()
        self._results = []

    def run(self, run: Any) -> None:
        """Run with the bound inputs and outputs, through ``run(feeds, names, targets)`` (the
        session's), and keep the outputs for ``get_outputs``."""
        if not self.outputs:
            raise InputError(f"{_WHERE}: no output is bound; bind_output() the outputs to compute")
        targets = {name: array for name, array in self.outputs.items() if array is not None}
        results = run(self.inputs, list(self.outputs), targets)
        self._results = [OrtValue(array) for array in results]
