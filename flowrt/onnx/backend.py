"""flowrt as an ``onnx.backend.base.Backend``, so onnx's conformance suite can run it.

::

    import onnx.backend.test
    from flowrt.onnx import backend
    tests = onnx.backend.test.BackendTest(backend.FlowrtBackend, __name__)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, namedtupledict

from flowrt import defaults
from flowrt.session import InferenceSession


class FlowrtBackendRep(BackendRep):
    """A prepared model: runs positional inputs (in the model's input order) or a dict of them."""

    def __init__(self, session: InferenceSession) -> None:
        self.session = session
        self.output_names = [o.name for o in session.get_outputs()]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        names = [i.name for i in self.session.get_inputs()]
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            feeds = dict(zip(names, inputs))
        outputs = self.session.run(None, feeds)
        return namedtupledict("Outputs", self.output_names)(*outputs)


class FlowrtBackend(Backend):
    """Runs models on the backends in ``backends``, CPU device only: by default flowrt's CPU
    list, CpuAcc then CpuRef (``flowrt.defaults``; GpuAcc is not a CPU device). A subclass, or
    ``prepare(..., backends=[...])``, names others: ``backends = ("CpuRef",)`` for the reference."""

    backends: Sequence[str] = defaults.CPU_BACKENDS

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> FlowrtBackendRep:
        super().prepare(model, device, **kwargs)
        backends = kwargs.get("backends", cls.backends)
        return FlowrtBackendRep(InferenceSession(model, backends=backends))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"


prepare = FlowrtBackend.prepare
run_model = FlowrtBackend.run_model
run_node = FlowrtBackend.run_node
supports_device = FlowrtBackend.supports_device
