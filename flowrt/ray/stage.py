"""``Stage``: one model of a Ray pipeline, and where its replicas run.

A stage names a model (a ``flowrt.Network``, an ``OptimizedNetwork``, a path to an ONNX or a
.flowrt file, or ONNX bytes), how many replicas of it to start, how each replica runs it
(backends, CPU worker threads, memory pools) and where Ray places them: on a node, on nodes that
have some custom resources, or in the bundles of a placement group.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from flowrt.engine.graph.network import Network
from flowrt.engine.graph.optimizer import OptimizedNetwork
from flowrt.errors import ArgumentError, ModelLoadError
from flowrt.serialize import is_flowrt_file
from flowrt.serialize import load as load_flowrt


def _positive(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ArgumentError(f"Stage: {attribute.name} must be a positive int, got {value!r}")


def _optional_positive(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None:
        _positive(instance, attribute, value)


def _model(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, Network | OptimizedNetwork | str | os.PathLike | bytes):
        raise ArgumentError(
            "Stage: model must be a flowrt.Network, an OptimizedNetwork, a path to an ONNX or "
            f".flowrt file or ONNX bytes, got {type(value).__name__}"
        )


def _resources(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, int | float) and v >= 0 for k, v in value.items()
    ):
        raise ArgumentError(
            f"Stage: resources must map resource names to non-negative amounts, got {value!r}"
        )


@attrs.frozen
class ModelPayload:
    """A stage's model on its way to the replicas: ``kind`` "onnx" or "flowrt" with the file's
    bytes, or "network" with a ``Network`` or ``OptimizedNetwork``."""

    kind: str
    model: Any

    def network(self) -> Network | OptimizedNetwork:
        """The model, read where this runs (on a replica)."""
        if self.kind == "network":
            return self.model
        if self.kind == "onnx":
            from flowrt.onnx import load as load_onnx  # imports onnx: only for an ONNX model

            return load_onnx(self.model)
        with tempfile.NamedTemporaryFile(suffix=".flowrt") as f:  # .flowrt files load from a path
            f.write(self.model)
            f.flush()
            return load_flowrt(f.name, mmap=False)


@attrs.frozen
class Stage:
    """A model of a ``flowrt.ray.Pipeline``, run by ``replicas`` Ray actors.

    Each replica runs a flowrt ``Runtime(cpu_workers=cpu_workers)`` and loads the model with
    ``pools`` memory pools (``pools`` runs at once); a Network is optimized for ``backends``
    (default: flowrt's default list) on the replica's node. ``max_in_flight`` bounds the requests
    sent to one replica at once (default: twice ``pools``, so that the next request is already
    on its way while one runs); the stage's bound is that times ``replicas``. ``num_cpus`` is
    what each replica reserves from Ray (default: ``cpu_workers``).

    Placement, at most one of: ``node`` (a Ray node id: every replica there), ``placement_group``
    (a ``ray.util.placement_group``; replica i goes to bundle ``bundle_indices[i]``, default
    any bundle). ``resources`` (Ray custom resources each replica needs, e.g. ``{"gpu_box":
    1}``) combines with either. A replica that dies is restarted by Ray up to
    ``max_restarts`` times.
    """

    model: Network | OptimizedNetwork | str | os.PathLike | bytes = attrs.field(validator=_model)
    name: str | None = None
    replicas: int = attrs.field(default=1, validator=_positive)
    backends: Sequence[str] | None = None
    cpu_workers: int = attrs.field(default=1, validator=_positive)
    pools: int = attrs.field(default=1, validator=_positive)
    max_in_flight: int | None = attrs.field(default=None, validator=_optional_positive)
    num_cpus: float | None = None
    node: str | None = None
    resources: Mapping[str, float] = attrs.field(factory=dict, validator=_resources)
    placement_group: Any = None
    bundle_indices: Sequence[int] | None = None
    max_restarts: int = 3

    def __attrs_post_init__(self) -> None:
        if self.node is not None and self.placement_group is not None:
            raise ArgumentError(
                "Stage: give node or placement_group, not both "
                f"(node={self.node!r}, placement_group={self.placement_group!r})"
            )
        if self.bundle_indices is not None and len(self.bundle_indices) != self.replicas:
            raise ArgumentError(
                f"Stage: bundle_indices must give one bundle per replica ({self.replicas}), "
                f"got {list(self.bundle_indices)}"
            )
        if self.name is not None and not isinstance(self.name, str):
            raise ArgumentError(f"Stage: name must be a str, got {type(self.name).__name__}")

    @property
    def per_replica(self) -> int:
        """Requests sent to one replica at once."""
        return self.max_in_flight if self.max_in_flight is not None else 2 * self.pools

    def payload(self) -> ModelPayload:
        """The model as the replicas get it: a file's bytes, read here (on the caller's node, so
        that the replicas' nodes need no copy), or a network built in Python."""
        model = self.model
        if isinstance(model, Network | OptimizedNetwork):
            return ModelPayload("network", model)
        if isinstance(model, bytes):
            return ModelPayload("onnx", model)
        kind = "flowrt" if is_flowrt_file(model) else "onnx"
        try:
            with open(model, "rb") as f:
                return ModelPayload(kind, f.read())
        except OSError as e:
            raise ModelLoadError(f"Stage: cannot read the model file {os.fspath(model)!r}: {e}") from e

    def actor_options(self, index: int) -> dict[str, Any]:
        """Ray actor options of replica ``index``: resources, placement, restarts."""
        options: dict[str, Any] = {
            "num_cpus": self.cpu_workers if self.num_cpus is None else self.num_cpus,
            "max_restarts": self.max_restarts,
            # flowrt retries a request itself, once, on another replica: Ray must not replay it.
            "max_task_retries": 0,
        }
        if self.resources:
            options["resources"] = dict(self.resources)
        if self.node is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(self.node, soft=False)
        elif self.placement_group is not None:
            bundle = -1 if self.bundle_indices is None else self.bundle_indices[index]
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                self.placement_group, placement_group_bundle_index=bundle
            )
        return options
