"""An ensemble: a model of steps, each another model of the repository, declared in
``config.pbtxt`` as Triton declares one (``platform: "ensemble"``, ``ensemble_scheduling``).

A request's tensors flow from step to step: a step runs as soon as every tensor its inputs
map from is there (the request's inputs, or outputs of earlier steps), steps that do not
depend on each other at once, each through its model's own queue, so that its requests
batch with everyone else's. The ensemble's outputs are the tensors its ``output``
declares.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import trio

from flowrt.errors import InputError, ResourceError
from flowrt.serve import config as configs
from flowrt.serve.models import NotFound, first_error
from flowrt.serve.protocol import DATATYPES
from flowrt.types import Priority, TensorInfo


def _tensors(declared: tuple[configs.Tensor, ...], where: str) -> dict[str, TensorInfo]:
    infos = {}
    for tensor in declared:
        dtype = DATATYPES.get(tensor.data_type.removeprefix("TYPE_"))  # TYPE_FP32: the protocol's FP32
        if dtype is None:
            raise InputError(
                f"{where}: tensor {tensor.name!r} has data_type {tensor.data_type}, which flowrt does not serve"
            )
        infos[tensor.name] = TensorInfo(tensor.dims, dtype)
    return infos


class MemberGone(ResourceError):
    """A step's model is not served now (unloaded, or loading again): HTTP 503."""


class ServedEnsemble:
    """Serves an ensemble; ``member(name)`` is the served model of that name at the time of
    each request (a member loaded again serves the next request)."""

    rows = None  # requests pass to the steps as they come: each step's model splits them

    def __init__(
        self, name: str, version: int, config: configs.ModelConfig, member: Callable[[str], Any]
    ) -> None:
        where = f"ensemble {name!r}"
        self.name, self.version, self.config, self.member = name, version, config, member
        self.inputs = _tensors(config.inputs, where)
        self.outputs = _tensors(config.outputs, where)
        self.closed = trio.Event()
        available = set(self.inputs)
        pending = list(config.steps)
        while pending:  # every step can run: what it reads is there once the steps before ran
            ready = [s for s in pending if all(source in available for _, source in s.inputs)]
            if not ready:
                missing = sorted({src for s in pending for _, src in s.inputs} - available)
                raise InputError(f"{where}: no input or step output provides {missing}")
            for step in ready:
                model = member(step.model)  # NotFound when the member is not served
                taken = {own for own, _ in step.inputs}
                if taken != set(model.inputs):
                    raise InputError(
                        f"{where}: step {step.model!r} maps inputs {sorted(taken)}, the model takes {sorted(model.inputs)}"
                    )
                unknown = sorted({own for own, _ in step.outputs} - set(model.outputs))
                if unknown:
                    raise InputError(
                        f"{where}: step {step.model!r} maps outputs {unknown} the model does not have"
                    )
                available |= {tensor for _, tensor in step.outputs}
                pending.remove(step)
        missing = sorted(set(self.outputs) - available)
        if missing:
            raise InputError(f"{where}: no step produces its outputs {missing}")

    async def infer(
        self, feeds: Mapping[str, np.ndarray], priority: Priority, timeout: float | None
    ) -> tuple[dict[str, np.ndarray], float]:
        """The ensemble's outputs for one request, and the seconds its steps waited to start."""
        values: dict[str, Any] = dict(feeds)
        queued = 0.0
        pending = list(self.config.steps)
        while pending:
            ready = [s for s in pending if all(source in values for _, source in s.inputs)]
            results: dict[int, tuple[dict[str, np.ndarray], float]] = {}
            if len(ready) == 1:
                await self._step(ready[0], values, priority, timeout, results, 0)
            else:
                try:
                    async with trio.open_nursery() as nursery:
                        for index, step in enumerate(ready):
                            nursery.start_soon(self._step, step, values, priority, timeout, results, index)
                except BaseExceptionGroup as group:
                    raise first_error(group) from None
            for index, step in enumerate(ready):
                outputs, waited = results[index]
                queued += waited
                for own, tensor in step.outputs:
                    values[tensor] = outputs[own]
                pending.remove(step)
        return {name: values[name] for name in self.outputs}, queued

    async def _step(
        self, step: configs.Step, values: Mapping[str, Any], priority: Priority, timeout: float | None,
        results: dict[int, Any], index: int,
    ) -> None:  # fmt: skip
        try:
            model = self.member(step.model)
        except NotFound as e:  # this request cannot run now
            raise MemberGone(f"ensemble {self.name!r}: its step's model is not served: {e}") from None
        results[index] = await model.infer({own: values[src] for own, src in step.inputs}, priority, timeout)

    waiting = 0  # its requests wait in its steps' models' queues

    def pools(self) -> tuple[int, int]:
        return 0, 0  # it holds none: its steps' models do

    def batch_counts(self) -> dict[int, int]:
        return {}  # its steps' models batch, and report theirs

    def close(self) -> None:
        self.closed.set()
