"""InferenceSession: ONNX Runtime's synchronous session, with its names, arguments and types.

::

    import flowrt as ort
    sess = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
    (probs,) = sess.run(None, {"data": x})
    sess.run_async(None, {"data": x}, callback, user_data)   # returns at once

flowrt's own arguments stay as keywords: ``backends=["CpuRef"]``, ``options=``, ``cpu_workers=``.
The pieces of ONNX Runtime's API other than the session live in ``flowrt.ort_compat``.
"""

from __future__ import annotations

import copy
import datetime
import functools
import logging
import os
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import trio

from flowrt import network_cache
from flowrt.engine.graph.network import Network
from flowrt.engine.graph.optimizer import OptimizedNetwork, OptimizerOptions, optimize
from flowrt.errors import ArgumentError, InputError
from flowrt.loaded_network import LoadedNetwork
from flowrt.ort_compat import metadata
from flowrt.ort_compat.free_dims import override_free_dims
from flowrt.ort_compat.initializers import VariantModels, as_inputs, fed_initializers
from flowrt.ort_compat.io_binding import IOBinding
from flowrt.ort_compat.ortvalue import OrtValue
from flowrt.ort_compat.providers import providers_of
from flowrt.ort_compat.run_options import RunOptions, run_terminable
from flowrt.ort_compat.session_config import SessionConfig, resolve, split_positional
from flowrt.ort_compat.session_options import SessionOptions
from flowrt.ort_compat.types import type_name
from flowrt.profiling import write_chrome_trace
from flowrt.runtime import Runtime
from flowrt.serialize import is_flowrt_file
from flowrt.serialize import load as load_flowrt
from flowrt.serialize import save as save_flowrt
from flowrt.trio_thread import TrioThread
from flowrt.types import TensorInfo
from flowrt.validate import argument_error

logger = logging.getLogger(__name__)


@attrs.frozen
class NodeArg:
    """Name, shape and type of a session input or output (ONNX Runtime's NodeArg): ``shape`` a
    list of dims (an int, the model's name for a symbolic one, or None), ``type`` as ONNX
    Runtime writes it (``tensor(float)``)."""

    name: str
    shape: list | None
    type: str


class InferenceSession:
    """Load a model once and run it synchronously; each ``run`` blocks until outputs are ready.

    ``path_or_bytes`` is a path (an ONNX or a .flowrt file), ONNX bytes, an onnx ModelProto, a
    Network or an OptimizedNetwork. ``sess_options`` is a ``flowrt.SessionOptions``;
    ``providers`` and ``provider_options`` are ONNX Runtime's (see ``flowrt.ort_compat.providers``:
    CPUExecutionProvider is CpuAcc then CpuRef); with none, the session runs on flowrt's default
    list (``flowrt.defaults``): CpuAcc, CpuRef, with GpuAcc first only where OpenCL shows a
    GPU. Instead of providers, flowrt's
    ``backends`` (a list of backend ids, or one) and ``options`` (OptimizerOptions) may be
    given, as keywords; ``cpu_workers`` wins over ``intra_op_num_threads``. An
    OptimizedNetwork (or a .flowrt file) runs on the backends it was optimized for.
    The session owns a runtime in a thread of its own until ``close()`` (or garbage collection,
    or interpreter exit, whichever comes first).
    """

    def __init__(
        self,
        path_or_bytes: str | os.PathLike | bytes | Any,
        sess_options: SessionOptions | None = None,
        providers: Sequence[str | tuple[str, dict]] | None = None,
        provider_options: Sequence[dict] | None = None,
        *,
        backends: Sequence[str] | str | None = None,
        options: OptimizerOptions | None = None,
        cpu_workers: int | None = None,
        **kwargs: Any,
    ) -> None:
        # flowrt's old positional order was (model, backends, options): still taken.
        sess_options, providers, backends, options = split_positional(
            sess_options, providers, backends, options
        )
        self._options, self._cpu_workers = options, cpu_workers
        self._network, self._metadata, self._initializers = _read(path_or_bytes)
        if isinstance(self._network, OptimizedNetwork) and providers is backends is provider_options is None:
            # it runs on the backends it was optimized for: no default list to find (which
            # would probe OpenCL)
            backends = list(self._network.backends)
        config = resolve(sess_options, providers, provider_options, backends, options, cpu_workers, kwargs)
        self._thread: TrioThread | None = None
        self._finalizer: weakref.finalize | None = None
        self._start(config)

    def _start(self, config: SessionConfig) -> None:
        """Optimize for ``config``, start a runtime in a thread and load; then the session
        runs there (a runtime it ran in before is closed)."""
        optimized = _optimize(self._network, self._initializers, config)
        runtime = Runtime(**config.runtime)
        # The session's runtime lives in a trio loop of its own until close(): its CPU workers
        # serve every run, whichever thread (or trio loop) the caller is in.
        thread = TrioThread(name="flowrt-session", resource=runtime, what="InferenceSession")
        try:
            model: LoadedNetwork = thread.run(runtime.load, optimized)
        except BaseException:
            thread.close()
            raise
        old = self._finalizer
        self._config, self.optimized, self._model, self._thread = config, optimized, model, thread
        network, initializers = self._network, self._initializers  # not self: no cycle to keep it alive
        self._variants = VariantModels(
            lambda names: thread.run(runtime.load, _optimize(network, initializers, config, names))
        )
        # At garbage collection or interpreter exit: runs in flight end with an error.
        self._finalizer = weakref.finalize(self, thread.close)
        if old is not None:
            old()  # the runtime of set_providers' previous providers

    def _model_for(self, feeds: Any) -> LoadedNetwork:
        """The model a run of ``feeds`` runs on: the session's, or where ``feeds`` override
        initializers, the one in which those are inputs (see ``flowrt.ort_compat.initializers``)."""
        names = fed_initializers(self._initializers, feeds)
        return self._variants.get(names) if names else self._model

    def get_inputs(self) -> list[NodeArg]:
        return [NodeArg(n, _shape(i.shape), type_name(i.dtype)) for n, i in self._model.inputs.items()]

    def get_outputs(self) -> list[NodeArg]:
        return [
            NodeArg(n, None, "unknown") if i is None else NodeArg(n, _shape(i.shape), type_name(i.dtype))
            for n, i in self._model.outputs.items()
        ]

    def get_overridable_initializers(self) -> list[NodeArg]:
        """The initializers an ONNX model (IR version 4 or later) also lists as graph inputs:
        a run may feed them, by name, to replace their values. The first run that feeds a set
        of them optimizes and loads the model again for it (blocking, ``run_async`` too); runs
        that feed none run the model with them folded in as constants."""
        return [NodeArg(n, _shape(i.shape), type_name(i.dtype)) for n, i in self._initializers.items()]

    def get_modelmeta(self) -> metadata.ModelMetadata:
        """The ONNX model's metadata (read from its file on first call); empty for a model
        that is not ONNX."""
        if not isinstance(self._metadata, metadata.ModelMetadata):
            self._metadata = metadata.read(self._metadata) if self._metadata else metadata.ModelMetadata()
        return self._metadata

    def get_session_options(self) -> SessionOptions:
        """A copy of the session's options."""
        return copy.deepcopy(self._config.sess_options)

    def get_providers(self) -> list[str]:
        """The providers of the backends this session runs on, in preference order."""
        return providers_of(self.optimized.backends)

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        return {name: dict(self._config.provider_options.get(name, {})) for name in self.get_providers()}

    def set_providers(
        self, providers: Sequence[Any] | None = None, provider_options: Sequence[dict] | None = None
    ) -> None:
        """Run on other providers from now on (None: the default): the model is optimized and
        loaded again, in a new runtime; runs in flight on the old one end with an error."""
        if isinstance(self._network, OptimizedNetwork):
            raise ArgumentError(
                f"set_providers: this session runs a network optimized for {self.optimized.backends} "
                "(an OptimizedNetwork or a .flowrt file); make a session of the ONNX model to choose providers"
            )
        so = self._config.sess_options
        self._start(resolve(so, providers, provider_options, None, self._options, self._cpu_workers, {}))

    def disable_fallback(self) -> None:
        """Nothing to disable: flowrt never changes providers after a failed run."""

    def enable_fallback(self) -> None:
        """Nothing to enable: a layer a backend lacks falls back when the model is optimized."""

    def _output_names(self, output_names: Sequence[str] | None) -> list[str]:
        names = list(output_names) if output_names else list(self._model.outputs)
        unknown = [n for n in names if n not in self._model.outputs]
        if unknown:
            raise InputError(
                f"unknown output {unknown[0]!r}; the model's outputs are: {', '.join(self._model.outputs)}"
            )
        return names

    def _run(
        self,
        input_feed: Any,
        run_options: RunOptions | None,
        outputs: Mapping[str, np.ndarray] | None = None,
        on_device: frozenset[str] = frozenset(),
    ) -> dict[str, Any]:
        feeds = _arrays(input_feed)
        model = self._model_for(feeds)
        run = model.run
        if outputs or on_device:
            run = functools.partial(model.run, outputs=outputs, device_outputs=on_device)
        assert self._thread is not None  # started by __init__
        if not _check_run_options(run_options):
            return self._thread.run(run, feeds)
        return self._thread.run(run_terminable, run_options, run, feeds)

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        run_options: RunOptions | None = None,
    ) -> list[np.ndarray]:
        """Run once; returns the requested outputs (all, in model order, when None or empty) as
        a list. Feeds are arrays (or OrtValues). ``run_options.terminate`` ends the run.

        Blocks the calling thread, which may be any thread (a ``run_async`` callback's too).
        FlowrtError if the session is closed, or closes while the run is in flight.
        """
        names = self._output_names(output_names)
        results = self._run(input_feed, run_options)
        return [results[n] for n in names]

    def run_with_ort_values(
        self,
        output_names: Sequence[str] | None,
        input_dict_ort_values: Mapping[str, OrtValue],
        run_options: RunOptions | None = None,
    ) -> list[OrtValue]:
        """``run`` with OrtValues in and out (their arrays are read in place)."""
        return [OrtValue(a) for a in self.run(output_names, input_dict_ort_values, run_options)]

    def io_binding(self) -> IOBinding:
        """A new IOBinding for ``run_with_iobinding``."""
        return IOBinding(self)

    def run_with_iobinding(self, iobinding: IOBinding, run_options: RunOptions | None = None) -> None:
        """Run on ``iobinding``'s inputs; outputs bound to arrays are written into them, all
        are then in ``iobinding.get_outputs()``."""
        if not isinstance(iobinding, IOBinding) or iobinding.session is not self:
            raise argument_error(
                "iobinding",
                "an IOBinding of this session (session.io_binding())",
                iobinding,
                "run_with_iobinding",
            )

        def run(
            feeds: Any, names: list[str], targets: dict[str, np.ndarray], on_device: frozenset[str]
        ) -> list[Any]:
            names = self._output_names(names)
            results = self._run(feeds, run_options, targets, on_device)
            return [results[n] for n in names]

        iobinding.run(run)

    def run_async(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        callback: Callable[[list[np.ndarray] | None, Any, str], None],
        user_data: Any = None,
        run_options: RunOptions | None = None,
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
        _check_run_options(run_options)
        thread, feeds = self._thread, _arrays(input_feed)
        assert thread is not None  # started by __init__
        call = (thread, self._model_for(feeds), names, feeds, callback, user_data, run_options)
        thread.start_soon(_run_and_call_back, *call)

    def end_profiling(self) -> str:
        """Write the workloads' timings since profiling began (``enable_profiling``) as a Chrome
        trace, ``<profile_file_prefix>_<date>_<time>.json``, and stop profiling; returns the
        file's path, or "" when the session is not profiling (as ONNX Runtime does)."""
        if not self._model.profiling:
            return ""
        records = []
        for model in (self._model, *self._variants.models()):
            model.profiling = False
            records += model.profile(clear=True)
        now = datetime.datetime.now()
        stamp = f"{now:%Y-%m-%d_%H-%M-%S}_{now.microsecond // 1000:03d}"
        path = f"{self._config.sess_options.profile_file_prefix}_{stamp}.json"
        write_chrome_trace(records, path)
        return path

    def close(self) -> None:
        """Stop the session's runtime and its thread; idempotent, safe from any thread.

        Runs in flight are cancelled: threads blocked in ``run`` get FlowrtError, pending
        ``run_async`` callbacks are called with the error. Returns once the thread has ended,
        except from a callback, where it returns at once and the session ends after it.
        """
        assert self._finalizer is not None and self._thread is not None  # set by __init__
        self._finalizer.detach()
        self._thread.close()

    def __enter__(self) -> InferenceSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


async def _run_and_call_back(thread, model, names, feeds, callback, user_data, run_options) -> None:
    """A ``run_async`` run, in the session's loop; ``callback`` is called in a worker thread."""
    try:
        if run_options is None:
            results = await model.run(feeds)
        else:
            results = await run_terminable(run_options, model.run, feeds)
    except trio.Cancelled:
        error = "FlowrtError: this InferenceSession was closed before the run finished"
        await thread.call_in_thread(callback, None, user_data, error)
        raise
    except Exception as e:
        outputs, error = None, f"{type(e).__name__}: {e}"
    else:
        outputs, error = [results[n] for n in names], ""
    await thread.call_in_thread(callback, outputs, user_data, error)


def _optimize(
    network: Network | OptimizedNetwork,
    initializers: Mapping[str, TensorInfo],
    config: SessionConfig,
    inputs: frozenset[str] = frozenset(),
) -> OptimizedNetwork:
    """``network`` optimized for ``config``, with the overridable initializers named in
    ``inputs`` as inputs (with none, it is saved to ``optimized_model_filepath``)."""
    if isinstance(network, OptimizedNetwork):
        return network
    overrides = config.sess_options.free_dimension_overrides

    def build() -> OptimizedNetwork:
        graph = as_inputs(network, {n: initializers[n] for n in inputs})
        graph = override_free_dims(graph, overrides)
        return optimize(graph, backends=list(config.backends), options=config.options)

    extra = ["session", sorted(inputs), sorted(overrides.items())]
    optimized = network_cache.through(network, list(config.backends), config.options, extra, build)
    if config.sess_options.optimized_model_filepath and not inputs:
        save_flowrt(optimized, config.sess_options.optimized_model_filepath)
    return optimized


def _check_run_options(run_options: Any) -> bool:
    """True for RunOptions; False for None; ArgumentError for anything else."""
    if run_options is not None and not isinstance(run_options, RunOptions):
        raise argument_error(
            "run_options", "a flowrt.RunOptions or None", run_options, "InferenceSession.run"
        )
    return run_options is not None


def _shape(shape: tuple | None) -> list | None:
    return None if shape is None else list(shape)


def _arrays(input_feed: Any) -> Any:
    """The feeds with each OrtValue as its array or DeviceArray (the run checks the rest)."""
    if isinstance(input_feed, Mapping) and any(isinstance(v, OrtValue) for v in input_feed.values()):
        return {k: v.data() if isinstance(v, OrtValue) else v for k, v in input_feed.items()}
    return input_feed


_MODEL_TYPES = "a path (str or os.PathLike), ONNX bytes, an onnx.ModelProto, a flowrt.Network or a flowrt.OptimizedNetwork"


def _read(model: Any) -> tuple[Network | OptimizedNetwork, Any, dict[str, TensorInfo]]:
    """The session's model as a Network (or an OptimizedNetwork, which is not optimized again),
    what its metadata comes from (ModelMetadata, a path read when asked for, or None) and its
    overridable initializers. ArgumentError (also a TypeError) naming ``path_or_bytes`` when
    it is none of the types a session takes."""
    if isinstance(model, OptimizedNetwork | Network):
        return model, None, {}
    if isinstance(model, bytearray | memoryview):
        model = bytes(model)
    if isinstance(model, str | os.PathLike):
        if is_flowrt_file(model):
            return load_flowrt(model), None, {}
        network, initializers = _load_onnx(model)
        return network, os.fspath(model), initializers
    if isinstance(model, bytes):
        network, initializers = _load_onnx(model)  # first, so that bad bytes get its ModelLoadError
        return network, metadata.read(model), initializers
    onnx = sys.modules.get("onnx")  # imported when first needed: a ModelProto comes with it
    if onnx is not None and isinstance(model, onnx.ModelProto):
        network, initializers = _load_onnx(model)
        return network, metadata.from_model(model), initializers
    raise argument_error("path_or_bytes", _MODEL_TYPES, model, where="InferenceSession")


def _load_onnx(model: Any) -> tuple[Network, dict[str, TensorInfo]]:
    """The model and its overridable initializers; a file's through the cache of optimized
    networks (``flowrt.network_cache``), which may hold them without parsing."""

    def parse() -> tuple[Network, dict[str, TensorInfo]]:
        from flowrt.frontends.onnx.importer import load_with_initializer_inputs  # imports onnx

        return load_with_initializer_inputs(model)

    if isinstance(model, str | os.PathLike):
        return network_cache.load_onnx_with_initializers(model, parse)
    return parse()
