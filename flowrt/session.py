"""InferenceSession: a synchronous, ONNX Runtime-style front door for people coming from it.

::

    sess = flowrt.InferenceSession("model.onnx", backends=["CpuRef"])
    (probs,) = sess.run(None, {"data": x})
    sess.run_async(None, {"data": x}, callback, user_data)   # returns at once
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import onnx
import trio

from flowrt.engine.graph.network import Network
from flowrt.engine.graph.optimizer import OptimizedNetwork, OptimizerOptions, optimize
from flowrt.errors import InputError
from flowrt.frontends.onnx import load as load_onnx
from flowrt.loaded_network import LoadedNetwork
from flowrt.runtime import Runtime
from flowrt.trio_thread import TrioThread
from flowrt.validate import argument_error


@attrs.frozen
class NodeArg:
    """Name, shape and dtype of a session input or output (ONNX Runtime's NodeArg)."""

    name: str
    shape: tuple | None
    type: str


class InferenceSession:
    """Load a model once and run it synchronously; each ``run`` blocks until outputs are ready.

    ``model`` is a path, ONNX bytes, an onnx ModelProto, a Network or an OptimizedNetwork.
    The session owns a runtime in a thread of its own until ``close()`` (or garbage collection,
    or interpreter exit, whichever comes first).
    """

    def __init__(
        self,
        model: str | os.PathLike | bytes | Any,
        backends: Sequence[str] = ("CpuRef",),
        options: OptimizerOptions | None = None,
        *,
        cpu_workers: int | None = None,
    ) -> None:
        self.optimized = _optimized(model, backends, options)
        runtime = Runtime(cpu_workers=cpu_workers)
        # The session's runtime lives in a trio loop of its own until close(): its CPU workers
        # serve every run, whichever thread (or trio loop) the caller is in.
        self._thread = TrioThread(name="flowrt-session", resource=runtime, what="InferenceSession")
        # At garbage collection or interpreter exit: runs in flight end with an error.
        self._finalizer = weakref.finalize(self, self._thread.close)
        try:
            self._model: LoadedNetwork = self._thread.run(runtime.load, self.optimized)
        except BaseException:
            self.close()
            raise

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
        """Run once; returns the requested outputs (all, in model order, when None) as a list.

        Blocks the calling thread, which may be any thread (a ``run_async`` callback's too).
        FlowrtError if the session is closed, or closes while the run is in flight.
        """
        names = self._output_names(output_names)
        results = self._thread.run(self._model.run, input_feed)
        return [results[n] for n in names]

    def run_async(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        callback: Callable[[list[np.ndarray] | None, Any, str], None],
        user_data: Any = None,
    ) -> None:
        """Start a run and return at once; ``callback(outputs, user_data, error)`` is called
        when it ends: ``outputs`` a list in the order of ``output_names`` and ``error`` "" on
        success, ``outputs`` None and ``error`` the message on failure (ONNX Runtime's
        ``run_async``). Runs started this way execute concurrently, up to the model's pool
        count. Callbacks run in worker threads of the session, so they may call ``run``,
        ``run_async`` or ``close``. Every callback is called once: a run still pending at
        ``close()`` reports that the session was closed, and ``close()`` waits for callbacks.
        """
        names = self._output_names(output_names)
        if not callable(callback):
            raise argument_error(
                "callback",
                "a callable (outputs, user_data, error)",
                callback,
                where="InferenceSession.run_async",
            )
        self._thread.start_soon(self._run_and_call_back, names, input_feed, callback, user_data)

    async def _run_and_call_back(self, names, input_feed, callback, user_data) -> None:
        try:
            results = await self._model.run(input_feed)
        except trio.Cancelled:
            error = "FlowrtError: this InferenceSession was closed before the run finished"
            await self._thread.call_in_thread(callback, None, user_data, error)
            raise
        except Exception as e:
            outputs, error = None, f"{type(e).__name__}: {e}"
        else:
            outputs, error = [results[n] for n in names], ""
        await self._thread.call_in_thread(callback, outputs, user_data, error)

    def close(self) -> None:
        """Stop the session's runtime and its thread; idempotent, safe from any thread.

        Runs in flight are cancelled: threads blocked in ``run`` get FlowrtError, pending
        ``run_async`` callbacks are called with the error. Returns once the thread has ended,
        except from a callback, where it returns at once and the session ends after it.
        """
        self._finalizer.detach()
        self._thread.close()

    def __enter__(self) -> InferenceSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_MODEL_TYPES = "a path (str or os.PathLike), ONNX bytes, an onnx.ModelProto, a flowrt.Network or a flowrt.OptimizedNetwork"


def _optimized(model: Any, backends: Sequence[str], options: OptimizerOptions | None) -> OptimizedNetwork:
    """The session's model, optimized for ``backends``; ArgumentError (also a TypeError)
    naming ``model`` when it is none of the types a session takes."""
    if isinstance(model, OptimizedNetwork):
        return model
    if isinstance(model, (bytearray, memoryview)):
        model = bytes(model)
    if not isinstance(model, (Network, str, os.PathLike, bytes, onnx.ModelProto)):
        raise argument_error("model", _MODEL_TYPES, model, where="InferenceSession")
    net = model if isinstance(model, Network) else load_onnx(model)
    return optimize(net, backends=backends, options=options)
