"""InferenceSession: a synchronous, ONNX Runtime-style front door for people coming from it.

::

    sess = flowrt.InferenceSession("model.onnx", backends=["CpuRef"])
    (probs,) = sess.run(None, {"data": x})
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import trio

from flowrt.engine.graph.network import Network
from flowrt.engine.graph.optimizer import OptimizedNetwork, OptimizerOptions, optimize
from flowrt.errors import InputError
from flowrt.frontends.onnx import load as load_onnx
from flowrt.runtime import LoadedNetwork, Runtime


@attrs.frozen
class NodeArg:
    """Name, shape and dtype of a session input or output (ONNX Runtime's NodeArg)."""

    name: str
    shape: tuple | None
    type: str


class InferenceSession:
    """Load a model once and run it synchronously; each ``run`` blocks until outputs are ready.

    ``model`` is a path, ONNX bytes, an onnx ModelProto, a Network or an OptimizedNetwork.
    """

    def __init__(
        self,
        model: str | os.PathLike | bytes | Any,
        backends: Sequence[str] = ("CpuRef",),
        options: OptimizerOptions | None = None,
        *,
        cpu_workers: int | None = None,
    ) -> None:
        if isinstance(model, OptimizedNetwork):
            self.optimized = model
        else:
            net = model if isinstance(model, Network) else load_onnx(model)
            self.optimized = optimize(net, backends=backends, options=options)
        self._runtime = Runtime(cpu_workers=cpu_workers)
        self._model: LoadedNetwork = trio.run(self._load)

    async def _load(self) -> LoadedNetwork:
        async with self._runtime as rt:
            return await rt.load(self.optimized)

    def get_inputs(self) -> list[NodeArg]:
        return [NodeArg(n, i.shape, f"tensor({i.dtype.name.lower()})") for n, i in self._model.inputs.items()]

    def get_outputs(self) -> list[NodeArg]:
        return [
            NodeArg(
                n,
                None if i is None else i.shape,
                "unknown" if i is None else f"tensor({i.dtype.name.lower()})",
            )
            for n, i in self._model.outputs.items()
        ]

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any]) -> list[np.ndarray]:
        """Run once; returns the requested outputs (all, in model order, when None) as a list."""
        names = list(self._model.outputs) if output_names is None else list(output_names)
        unknown = [n for n in names if n not in self._model.outputs]
        if unknown:
            raise InputError(
                f"unknown output {unknown[0]!r}; the model's outputs are: {', '.join(self._model.outputs)}"
            )
        results = trio.run(self._model.run, input_feed)
        return [results[n] for n in names]
