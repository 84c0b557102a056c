"""InferenceSession: a synchronous, ONNX Runtime-style front door for people coming from it.

::

    sess = flowrt.InferenceSession("model.onnx", backends=["CpuRef"])
    (probs,) = sess.run(None, {"data": x})
    sess.run_async(None, {"data": x}, callback, user_data)   # returns at once
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import trio

from flowrt.engine.graph.network import Network
from flowrt.engine.graph.optimizer import OptimizedNetwork, OptimizerOptions, optimize
from flowrt.errors import FlowrtError, InputError
from flowrt.frontends.onnx import load as load_onnx
from flowrt.loaded_network import LoadedNetwork
from flowrt.runtime import Runtime
from flowrt.trio_thread import TrioThread

logger = logging.getLogger(__name__)


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
        # The session's runtime lives in a trio loop of its own until close(): its CPU workers
        # serve every run, whichever thread (or trio loop) the caller is in.
        self._thread = TrioThread(name="flowrt-session")
        self._finalizer = weakref.finalize(self, self._thread.close)
        try:
            self._model: LoadedNetwork = self._thread.start(self._serve)
        except BaseException:
            self.close()
            raise

    async def _serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with self._runtime as rt:
            task_status.started(await rt.load(self.optimized))
            await trio.sleep_forever()

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

    def _output_names(self, output_names: Sequence[str] | None) -> list[str]:
        names = list(self._model.outputs) if output_names is None else list(output_names)
        unknown = [n for n in names if n not in self._model.outputs]
        if unknown:
            raise InputError(
                f"unknown output {unknown[0]!r}; the model's outputs are: {', '.join(self._model.outputs)}"
            )
        return names

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any]) -> list[np.ndarray]:
        """Run once; returns the requested outputs (all, in model order, when None) as a list."""
        names = self._output_names(output_names)
        results = self._live_thread().run(self._model.run, input_feed)
        return [results[n] for n in names]

    def _live_thread(self) -> TrioThread:
        if self._thread is None:
            raise FlowrtError("this InferenceSession is closed")
        return self._thread

    def run_async(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        callback: Callable[[list[np.ndarray] | None, Any, str], None],
        user_data: Any = None,
    ) -> None:
        """Start a run and return at once; ``callback(outputs, user_data, error)`` is called
        from the session's runtime thread when it ends: ``outputs`` a list in the order of
        ``output_names`` and ``error`` "" on success, ``outputs`` None and ``error`` the
        message on failure (ONNX Runtime's ``run_async``). Runs started this way execute
        concurrently, up to the model's pool count. ``close()`` stops the runtime thread.
        """
        names = self._output_names(output_names)
        self._live_thread().start_soon(self._run_and_call_back, names, input_feed, callback, user_data)

    async def _run_and_call_back(self, names, input_feed, callback, user_data) -> None:
        try:
            results = await self._model.run(input_feed)
        except Exception as e:
            outputs, error = None, f"{type(e).__name__}: {e}"
        else:
            outputs, error = [results[n] for n in names], ""
        try:
            callback(outputs, user_data, error)
        except Exception:  # the caller's bug must not take the runtime thread down
            logger.exception("run_async callback raised")

    def close(self) -> None:
        """Stop the session's runtime and its thread (cancelling runs in flight); idempotent."""
        if self._thread is not None:
            self._finalizer()
            self._thread = None

    def __enter__(self) -> InferenceSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
