"""What a backend implements, as protocols: a third-party backend need not inherit from us.

Arm NN's ``IBackendInternal``, ``ILayerSupport``, ``IWorkloadFactory`` and ``IWorkload``,
in Python spelling.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs
import numpy as np

from flowrt.types import TensorInfo


@attrs.frozen
class Support:
    """A layer-support answer: whether the backend takes the layer, and why not."""

    supported: bool
    reason: str = ""

    @classmethod
    def yes(cls) -> Support:
        return cls(True)

    @classmethod
    def no(cls, reason: str) -> Support:
        return cls(False, reason)


# The kinds a FusedActivation may name. They are facts of the layer kinds (the activation table,
# ``flowrt.engine.graph.layer_kind``), a room above this one: it hands this over when
# imported, as a backend registers itself here. ``import flowrt`` imports it.
_fusable_activation_kinds: Callable[[], Collection[str]] = tuple


# The forms a kind has besides its plain one (Gelu's "tanh"), handed over the same way.
def _no_forms(kind: str) -> Collection[str]:
    return ()


_activation_forms: Callable[[str], Collection[str]] = _no_forms


def set_fusable_activation_kinds(
    kinds: Callable[[], Collection[str]], forms: Callable[[str], Collection[str]]
) -> None:
    """Make ``kinds()`` the kinds a :class:`FusedActivation` may name, and ``forms(kind)`` the
    forms it may take besides the plain one (called once, by the activation table)."""
    global _fusable_activation_kinds, _activation_forms
    _fusable_activation_kinds, _activation_forms = kinds, forms


def _fusable_kind(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    kinds = _fusable_activation_kinds()
    if value not in kinds:
        raise ValueError(f"{attribute.name!r} must be in {tuple(kinds)!r} (got {value!r})")


def _activation_form(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    forms = _activation_forms(instance.kind)
    if value and value not in forms:
        raise ValueError(
            f"{attribute.name!r} of {instance.kind} must be '' or in {tuple(forms)!r} (got {value!r})"
        )


@attrs.frozen
class FusedActivation:
    """An activation a workload applies to its own output before writing it.

    ``kind`` is an activation kind that may be fused (its ``ActivationFact`` in the activation
    table says so); ``alpha`` and ``beta`` are what that fact's ``params`` read from the layer
    (LeakyRelu's slope, Clip's bounds, ...); ``form`` names one of the kind's other forms, each
    a code of its own (Gelu's "tanh"), or is empty.
    """

    kind: str = attrs.field(validator=_fusable_kind)
    alpha: float = 0.0
    beta: float = 0.0
    form: str = attrs.field(default="", validator=_activation_form)


@attrs.frozen
class WorkloadInfo:
    """Everything a workload factory needs to build one layer's workload.

    ``constants`` holds, per input, the array when that input is a constant (weights), so a
    backend may pack it once at load. ``activation``, when set, is an activation the optimizer
    fused into this layer: the workload applies it to its output. ``fast_math`` is the
    network's ``OptimizerOptions.fast_math``: the workload may take faster, less exact
    algorithms (Arm NN's FastMathEnabled). ``fp16_weights`` is the network's
    ``OptimizerOptions.reduce_fp32_to_fp16``: a backend that declares capability
    ``fp16_weights`` may keep this layer's constant float32 weights as float16, computing in
    float32.
    """

    layer_name: str
    kind: str
    descriptor: Any
    inputs: tuple[TensorInfo | None, ...]
    outputs: tuple[TensorInfo, ...]
    constants: tuple[np.ndarray | None, ...] = attrs.field(default=(), eq=False)
    activation: FusedActivation | None = None
    fast_math: bool = False
    fp16_weights: bool = False


@runtime_checkable
class LayerSupport(Protocol):
    """Answers, per layer, whether a backend can run it."""

    def is_layer_supported(
        self,
        kind: str,
        descriptor: Any,
        inputs: Sequence[TensorInfo | None],
        outputs: Sequence[TensorInfo | None],
    ) -> Support: ...


@runtime_checkable
class Workload(Protocol):
    """One layer's work on one backend.

    ``prepare()`` does one-time work at load; ``execute(inputs)`` takes one array per input
    slot (None for absent optional inputs) and returns one array per output. It blocks.

    A workload may also take ``execute(inputs, outputs)``, where ``outputs`` holds one
    preallocated C-contiguous array per output (the run's planned memory): it then writes its
    results there and returns those arrays. The executor passes ``outputs`` only to workloads
    whose ``writes_in_place`` attribute is true.

    A host workload whose ``takes_job`` attribute is true is called ``execute(inputs, outputs,
    job)`` instead (``outputs`` None where it does not write in place) and ``prepare(job)`` at
    load: ``job`` is the running job's ``flowrt.engine.scheduler.job.JobContext`` (the threads
    it has now), or None off a job.

    A host workload may also offer ``bind(inputs, outputs)``: the arrays it will read and
    write in every run of one memory pool (constants and pool tensors; ``outputs`` None where
    unplanned). It answers None, or a bound call with ``outputs`` (the arrays its outputs will
    be) and ``program``, whose ``compile(calls)`` makes one callable of consecutive bound calls
    (see ``flowrt.engine.scheduler.binding``).
    """

    def prepare(self) -> None: ...

    def execute(self, inputs: Sequence[np.ndarray | None]) -> Sequence[np.ndarray]: ...


@runtime_checkable
class WorkloadFactory(Protocol):
    """Builds workloads for the layers assigned to its backend."""

    def create_workload(self, info: WorkloadInfo) -> Workload: ...


@runtime_checkable
class Backend(Protocol):
    """A stateless factory object for everything a backend provides.

    ``create_context`` and the load hooks are optional; the runtime calls them when present.
    So is ``compile_ahead(network, job)``: a context manager the runtime enters around the
    building of a load's workloads (CpuAcc compiles kernels in a second process meanwhile).
    """

    @property
    def id(self) -> str: ...

    @property
    def version(self) -> tuple[int, int]: ...

    @property
    def capabilities(self) -> dict[str, Any]: ...

    def layer_support(self) -> LayerSupport: ...

    def optimize_subgraph(self, view: Any) -> Any: ...

    def create_memory_manager(self) -> Any: ...

    def create_workload_factory(self, memory_manager: Any) -> WorkloadFactory: ...
