"""A backend whose runs hold their CPU worker until the test opens a gate: runs in flight on
demand, for the InferenceSession's close tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fakes import _Support

import flowrt
from flowrt.registry import OptimizationViews, backend_registry
from flowrt.types import TensorInfo


class Gate:
    """``started`` counts workloads that began; they all wait until ``release()``."""

    def __init__(self) -> None:
        self.started = threading.Semaphore(0)
        self._open = threading.Event()

    def release(self) -> None:
        self._open.set()

    def wait_started(self, timeout: float = 10) -> bool:
        return self.started.acquire(timeout=timeout)

    def workload(self, info) -> Any:
        gate = self

        class GatedWorkload:
            def prepare(self) -> None:
                pass

            def execute(self, inputs):
                gate.started.release()
                if not gate._open.wait(timeout=30):
                    raise TimeoutError("the test never opened the gate")
                return [inputs[0].copy()]

        return GatedWorkload()


class GatedBackend:
    """Runs "Relu" layers as a copy that waits for the current ``Gate``."""

    id = "GatedSessionTest"
    version = (1, 0)
    capabilities: dict[str, Any] = {"host_memory": True}
    gate: Gate

    def layer_support(self) -> _Support:
        return _Support(self.id, {"Relu"})

    def optimize_subgraph(self, view) -> OptimizationViews:
        views = OptimizationViews()
        views.add_untouched(view)
        return views

    def create_memory_manager(self) -> None:
        return None

    def create_workload_factory(self, memory_manager):
        gate = self.gate
        return type("GatedFactory", (), {"create_workload": lambda self, info: gate.workload(info)})()


@contextmanager
def gated_model() -> Iterator[tuple[flowrt.OptimizedNetwork, Gate]]:
    """x -> gated copy -> y, optimized for GatedBackend (registered in the default registry,
    which an InferenceSession's runtime uses, while the block runs)."""
    gate = Gate()
    registry = backend_registry()
    registry.register(GatedBackend.id, lambda: type("Bound", (GatedBackend,), {"gate": gate})())
    try:
        net = flowrt.Network()
        net.add_output("y", net.add_layer("Relu", inputs=[net.add_input("x", TensorInfo((1,)))]))
        yield flowrt.optimize(net, backends=[GatedBackend.id], registry=registry), gate
    finally:
        gate.release()
        registry.unregister(GatedBackend.id)
