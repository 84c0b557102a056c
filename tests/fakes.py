"""Test backends written the way a third party would: no flowrt base classes."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from flowrt.registry import OptimizationViews, Support, WorkloadInfo
from flowrt.workers.cpu.ref.kernels import load_all


class _Support:
    def __init__(self, backend_id: str, kinds: set[str]) -> None:
        self.backend_id, self.kinds = backend_id, kinds

    def is_layer_supported(self, kind, descriptor, inputs, outputs) -> Support:
        if kind in self.kinds:
            return Support.yes()
        return Support.no(f"{self.backend_id} only runs {', '.join(sorted(self.kinds))}")


class _Workload:
    def __init__(self, info: WorkloadInfo, fail: bool, calls: list[str], inputs_seen: list) -> None:
        self.info, self.fail, self.calls, self.inputs_seen = info, fail, calls, inputs_seen

    def prepare(self) -> None:
        pass

    def execute(self, inputs):
        self.calls.append(self.info.layer_name)
        self.inputs_seen.append(list(inputs))
        if self.fail:
            raise ValueError("deliberate failure for the test")
        result = load_all()[self.info.kind](self.info.descriptor, *inputs)
        return list(result) if isinstance(result, tuple) else [np.asarray(result)]


class _Factory:
    def __init__(self, backend: PartialBackend) -> None:
        self.backend = backend

    def create_workload(self, info: WorkloadInfo) -> _Workload:
        return _Workload(
            info, info.kind in self.backend.fail_kinds, self.backend.calls, self.backend.inputs_seen
        )


class PartialBackend:
    """Runs only ``kinds`` (with CpuRef's kernels); workloads of ``fail_kinds`` raise when run."""

    version = (1, 0)
    capabilities: dict[str, Any] = {"host_memory": True}

    def __init__(
        self,
        backend_id: str,
        kinds: set[str],
        fail_kinds: set[str] = frozenset(),
        fail_subgraphs: bool = False,
    ) -> None:
        self.id = backend_id
        self.kinds = set(kinds)
        self.fail_kinds = set(fail_kinds)
        self.fail_subgraphs = fail_subgraphs
        self.calls: list[str] = []
        self.inputs_seen: list[list] = []

    def layer_support(self) -> _Support:
        return _Support(self.id, self.kinds)

    def optimize_subgraph(self, view) -> OptimizationViews:
        views = OptimizationViews()
        (views.add_failed if self.fail_subgraphs else views.add_untouched)(view)
        return views

    def create_memory_manager(self) -> None:
        return None

    def create_workload_factory(self, memory_manager) -> _Factory:
        return _Factory(self)


class _SleepyWorkload:
    def __init__(self, info: WorkloadInfo) -> None:
        self.info = info

    def prepare(self) -> None:
        pass

    def execute(self, inputs):
        (x,) = inputs
        delay = float(x.flat[0])
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        time.sleep(delay)
        return [x.copy()]


class SleepyBackend:
    """Runs Identity-like "Relu" layers that sleep as many seconds as their first input element
    says (and fail on a negative one): runs of chosen lengths, for scheduling tests."""

    id = "Sleepy"
    version = (1, 0)
    capabilities: dict[str, Any] = {"host_memory": True}

    def layer_support(self) -> _Support:
        return _Support(self.id, {"Relu"})

    def optimize_subgraph(self, view) -> OptimizationViews:
        views = OptimizationViews()
        views.add_untouched(view)
        return views

    def create_memory_manager(self) -> None:
        return None

    def create_workload_factory(self, memory_manager):
        factory = type("SleepyFactory", (), {"create_workload": lambda self, info: _SleepyWorkload(info)})
        return factory()
