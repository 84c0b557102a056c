"""ONNX Runtime's ``IOBinding``: inputs read in place and outputs written into caller arrays,
for ``InferenceSession.run_with_iobinding``; host memory ("cpu") or the memory of the device
GpuAcc runs on ("opencl", as ONNX Runtime's "cuda"): inputs that stay there and outputs kept
there, as DeviceArrays."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from flowrt.engine.scheduler.device_array import DeviceArray
from flowrt.errors import InputError
from flowrt.ort_compat.ortvalue import OrtValue, array_at, at_address, on_device
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
        self.on_device: set[str] = set()  # outputs bound by name to the device
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
        """Bind input ``name`` to ``shape`` elements of ``element_type`` at ``buffer_ptr``: host
        memory ("cpu"), or on "opencl" the ``data_ptr()`` of a device OrtValue (read where it
        is, no upload)."""
        where = f"{_WHERE}.bind_input"
        if on_device(device_type, device_id, where):
            self.inputs[self._name(name)] = at_address(buffer_ptr, element_type, shape, where)
            return
        self.inputs[self._name(name)] = array_at(buffer_ptr, element_type, shape, where)

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        check_instance(
            "ortvalue", ortvalue, OrtValue, "a flowrt.OrtValue", where=f"{_WHERE}.bind_ortvalue_input"
        )
        self.inputs[self._name(name)] = ortvalue.data()

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
        array per run; on "opencl", to a new DeviceArray per run, kept on the device."""
        where = f"{_WHERE}.bind_output"
        device = on_device(device_type, device_id, where)
        name = self._name(name)
        self.on_device.discard(name)
        if device:
            if buffer_ptr is not None:
                raise argument_error(
                    "buffer_ptr",
                    'None on "opencl": each run makes the output a new device value',
                    buffer_ptr,
                    where,
                )
            self.outputs[name] = None
            self.on_device.add(name)
            return
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
        where = f"{_WHERE}.bind_ortvalue_output"
        check_instance("ortvalue", ortvalue, OrtValue, "a flowrt.OrtValue", where=where)
        if isinstance(ortvalue.data(), DeviceArray):
            raise argument_error(
                "ortvalue",
                'a host value (bind a device output by name: bind_output(name, "opencl"))',
                ortvalue,
                where,
            )
        name = self._name(name)
        self.on_device.discard(name)
        self.outputs[name] = ortvalue.numpy()

    def _name(self, name: Any) -> str:
        return check_instance("name", name, str, "an input or output name (str)", where=_WHERE)

    def synchronize_inputs(self) -> None:
        """Nothing to wait for: a device value is on the device once it is made."""

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
        self.on_device.clear()
        self._results = []

    def run(self, run: Any) -> None:
        """Run with the bound inputs and outputs, through ``run(feeds, names, targets,
        on_device)`` (the session's), and keep the outputs for ``get_outputs``."""
        if not self.outputs:
            raise InputError(f"{_WHERE}: no output is bound; bind_output() the outputs to compute")
        targets = {name: array for name, array in self.outputs.items() if array is not None}
        results = run(self.inputs, list(self.outputs), targets, frozenset(self.on_device))
        self._results = [OrtValue(array) for array in results]
