"""Optimized networks kept on disk for later processes, as OpenVINO's model cache keeps
compiled models: a second process that optimizes the same ONNX file the same way reads the
result back (a mapped .flowrt file) instead of parsing and optimizing again.

``flowrt.onnx.load(path)`` and ``flowrt.optimize(network, ...)`` use it by themselves:

- an optimize of a network loaded from a file, where parsing and optimizing took at least
  :data:`MIN_SECONDS` (less costs less than reading a result back), writes its result to
  the cache directory (``FLOWRT_CACHE_DIR``, else ``~/.cache/flowrt``, under
  ``networks/``), keyed by the file (its path, size, modification and change times and
  inode: a file written again is a new file), the backends' preference list, the
  optimizer's options, the backends themselves (class, version, capabilities), flowrt's
  sources and the machine's cores. A file changed less than :data:`RACY_NS` before its load
  is not kept (a second write within the file system's clock tick would leave those stamps
  as they were), nor one that changed between its load and the optimize;
- a later ``flowrt.onnx.load`` of a file the cache holds an optimized network of returns a
  network that parses the file only when something looks at its graph; ``optimize`` then
  reads the cached result without parsing. A network changed after its load (a layer
  added, removed, reconnected or given another descriptor) is optimized as usual and not
  cached.

``flowrt.InferenceSession(path)`` goes through it too (:func:`load_onnx_with_initializers`,
:func:`through`): its key adds the initializers fed as inputs and the free dimensions set,
and the file's overridable initializers are written down beside its entries, so that a
later session parses nothing either.

Only networks optimized for flowrt's own backends are cached (a third-party backend's
answers may hang on more than its class, version and capabilities), and only what
:func:`flowrt.save` can hold (no If, Loop or Scan). As with GpuAcc's program binaries, a
cache folder that others could write is neither read nor written. An entry that cannot be
read back (corrupt, made by another version) is removed and the network optimized again.
Each source path keeps the entries of its current file only; past 4 GiB in all
(``FLOWRT_NETWORK_CACHE_BYTES``) the least recently used entries go. Beside each entry, the
transformed weights backends make of its constants in later loads (Winograd transforms,
GEMM panels) are kept for the next process, which maps them instead of making them
(``network_cache_files``). ``FLOWRT_NETWORK_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowrt import network_cache_files as files
from flowrt import serialize, source_stamps, trusted_paths
from flowrt.defaults import cache_root, default_cpu_workers
from flowrt.engine.graph import optimizer
from flowrt.engine.graph.graph import Graph
from flowrt.engine.graph.network import Network
from flowrt.engine.memory.weights import MANAGER as WEIGHTS
from flowrt.errors import FlowrtError
from flowrt.registry import BackendRegistry, backend_registry
from flowrt.types import DataType, TensorInfo

if TYPE_CHECKING:
    from flowrt.engine.graph.optimizer import OptimizedNetwork, OptimizerOptions

logger = logging.getLogger(__name__)

ENV = "FLOWRT_NETWORK_CACHE"
FORMAT = 1
MIN_SECONDS = 0.05
RACY_NS = 2_000_000_000
OWN_BACKENDS = "flowrt.workers."  # the modules of the backends whose networks are cached


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def directory() -> Path:
    return cache_root() / "networks"


def _flowrt_stamp() -> str:
    """flowrt's sources: an optimized network is what these sources made of it."""
    return source_stamps.flowrt_digest()


class _Source:
    """An ONNX file a network was loaded from, and the network's graph as that load made it
    (the layers, their descriptors and connections, held so that a change shows)."""

    def __init__(self, path: str, check: bool) -> None:
        self.path = os.path.realpath(path)
        self.seen_ns = time.time_ns()
        stat = os.stat(self.path)
        self.changed_ns = max(stat.st_mtime_ns, stat.st_ctime_ns)
        self.folder = directory() / hashlib.sha1(f"{self.path}\0{check}".encode()).hexdigest()[:32]
        self.file = _stamp(stat)
        self.prefix = hashlib.sha1(self.file.encode()).hexdigest()[:16]
        self.graph: Graph | None = None
        self.state: list[tuple[Any, ...]] = []
        self._held: list[Any] = []  # what the state names by identity, kept alive
        self.parse_seconds = 0.0
        self._initializers: dict[str, list[Any]] | None = None

    def take(self, graph: Graph) -> None:
        self.graph, self.state = graph, _state(graph)
        self._held = _objects(graph)

    def unchanged(self, graph: Graph) -> bool:
        return graph is self.graph and _state(graph) == self.state

    def settled(self) -> bool:
        """Whether what was parsed is what :attr:`file` names: the file had not changed for
        :data:`RACY_NS` when it was looked at, and has not changed since."""
        try:
            now = _stamp(os.stat(self.path))
        except OSError:
            return False
        return now == self.file and self.seen_ns - self.changed_ns >= RACY_NS

    def initializers(self) -> dict[str, TensorInfo] | None:
        """The file's overridable initializers as :meth:`keep_initializers` wrote them down,
        or None."""
        try:
            if not _trusted(self.folder):
                return None
            data = json.loads((self.folder / f"{self.prefix}.initializers.json").read_text())
            return {
                name: TensorInfo(None if shape is None else tuple(shape), DataType[dtype])
                for name, (shape, dtype) in data.items()
            }
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def keep_initializers(self, initializers: dict[str, TensorInfo]) -> None:
        """Hold the file's overridable initializers, to be written down beside its first entry
        (plain data: their shapes and types), for a later session's load that parses nothing."""
        if all(info.quantization is None for info in initializers.values()):
            self._initializers = {
                name: [None if info.shape is None else list(info.shape), info.dtype.name]
                for name, info in initializers.items()
            }

    def write_initializers(self) -> None:
        """Write down the initializers :meth:`keep_initializers` holds, if any (once)."""
        data, self._initializers = self._initializers, None
        if data is None:
            return
        path = self.folder / f"{self.prefix}.initializers.json"
        try:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, path)
        except OSError as e:
            logger.info("the initializers of %s are not cached: %s", self.path, e)

    def entries(self) -> list[Path]:
        try:
            return [
                self.folder / n
                for n in os.listdir(self.folder)
                if n.startswith(self.prefix) and n.endswith(".flowrt")
            ]
        except OSError:
            return []


def _stamp(stat: os.stat_result) -> str:
    return f"{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ctime_ns}:{stat.st_ino}"


def _objects(graph: Graph) -> list[Any]:
    """The objects whose identities :func:`_state` records: the source holds them, so that
    none of those identities can pass to a new object while they are compared (a descriptor
    replaced, then freed, and another made at its address)."""
    return [
        (
            layer,
            layer.descriptor,
            layer.activation,
            [s.source for s in layer.inputs],
            [o.info for o in layer.outputs],
        )
        for layer in graph.layers.values()
    ]


def _state(graph: Graph) -> list[tuple[Any, ...]]:
    """Each layer and what makes it, by the objects' identities (see :func:`_objects`)."""
    return [
        (
            id(layer),
            name,
            layer.kind,
            id(layer.descriptor),
            layer.backend,
            id(layer.activation),
            tuple((id(s.source), s.source.index) if s.source is not None else None for s in layer.inputs),
            tuple(id(o.info) for o in layer.outputs),
        )
        for name, layer in graph.layers.items()
    ]


_sources: weakref.WeakKeyDictionary[Network, _Source] = weakref.WeakKeyDictionary()


class _FileNetwork(Network):
    """A network of an ONNX file the cache has optimized before: the file is parsed when its
    graph is first looked at (by anything but an optimize that finds it cached)."""

    def __init__(self, parse: Callable[[], Network], source: _Source) -> None:
        self._parse: Callable[[], Network] | None = parse
        self._graph: Graph | None = None
        self._file_source = source

    @property
    def graph(self) -> Graph:
        if self._graph is None:
            assert self._parse is not None
            start = time.perf_counter()
            self._graph, self._parse = self._parse().graph, None
            self._file_source.parse_seconds = time.perf_counter() - start
            self._file_source.take(self._graph)
        return self._graph

    @graph.setter
    def graph(self, value: Graph) -> None:
        self._graph, self._parse = value, None

    @property
    def parsed(self) -> bool:
        return self._graph is not None

    def __reduce__(self) -> tuple[Any, ...]:
        return (_network_of, (self.graph,))


def _network_of(graph: Graph) -> Network:
    network = Network()
    network.graph = graph
    return network


def load_onnx(
    source: Any, *, check: bool, memory_budget: int | None, parse: Callable[[], Network]
) -> Network:
    """``flowrt.onnx.load``: ``parse()`` now, or later for a file the cache holds."""
    found = _source_for(source, check) if memory_budget is None else None
    if found is not None and found.entries():
        network: Network = _FileNetwork(parse, found)
        _sources[network] = found
        return network
    start = time.perf_counter()
    network = parse()
    _track(network, found, time.perf_counter() - start)
    return network


def load_onnx_with_initializers(
    path: str | os.PathLike, parse: Callable[[], tuple[Network, dict[str, TensorInfo]]]
) -> tuple[Network, dict[str, TensorInfo]]:
    """``InferenceSession``'s load of an ONNX file: the network and its overridable
    initializers (``parse()``), or, for a file the cache holds with its initializers, a
    network parsed only when its graph is looked at."""
    found = _source_for(path, True)
    if found is not None and found.entries():
        initializers = found.initializers()
        if initializers is not None:
            network: Network = _FileNetwork(lambda: parse()[0], found)
            _sources[network] = found
            return network, initializers
    start = time.perf_counter()
    network, initializers = parse()
    _track(network, found, time.perf_counter() - start)
    if found is not None:
        found.keep_initializers(initializers)
    return network, initializers


def _track(network: Network, found: _Source | None, seconds: float) -> None:
    if found is not None:
        found.parse_seconds = seconds
        found.take(network.graph)
        _sources[network] = found


def _source_for(source: Any, check: bool) -> _Source | None:
    if not enabled() or not isinstance(source, (str, os.PathLike)):
        return None
    try:
        return _Source(os.fspath(source), check)
    except (OSError, ValueError, TypeError):
        return None  # the parse reports what is wrong with the path
    except RuntimeError:  # no home directory to keep a cache in (Path.home)
        return None


def optimize(
    network: Network | Graph,
    backends: Sequence[str] | None = None,
    options: OptimizerOptions | None = None,
    registry: BackendRegistry | None = None,
) -> OptimizedNetwork:
    """``flowrt.optimize``: :func:`flowrt.engine.graph.optimizer.optimize` (its arguments,
    result and errors), through the cache for a network loaded from a file."""
    return through(
        network,
        backends,
        options,
        None,
        lambda: optimizer.optimize(network, backends, options, registry),
        registry,
    )


optimize.__doc__ = (
    (optimizer.optimize.__doc__ or "")
    + """
    A network that ``flowrt.onnx.load`` read from a file goes through the cache of optimized
    networks (``flowrt.network_cache``): a later process optimizing that file the same way
    reads the result back instead of parsing and optimizing again.
    """
)


def through(
    network: Any,
    backends: Any,
    options: Any,
    extra: Any,
    build: Callable[[], OptimizedNetwork],
    registry: BackendRegistry | None = None,
) -> OptimizedNetwork:
    """``build()``, the optimize of ``network`` for ``backends`` and ``options`` with the
    backends of ``registry`` (default: the process's; ``extra``: whatever else ``build`` does
    to it, in the key), or what the cache holds for it. Only a network loaded from a file and
    unchanged since, optimized for flowrt's own backends, goes through the cache."""
    registry = backend_registry() if registry is None else registry
    entry = _entry(network, backends, options, extra, registry)
    if entry is None:
        return build()
    if entry.exists() and _trusted(entry.parent):
        try:
            cached, buffer = serialize.load_buffered(entry, registry=registry)
        except FlowrtError as e:
            logger.warning("the cached optimized network %s is unusable, optimizing again: %s", entry, e)
            files.remove(entry)
        else:
            files.touch(entry)
            logger.info("optimized network read from the cache: %s", entry)
            cached.cached_from = str(entry)
            # the backends' transformed weights of its constants are kept beside it
            forms = files.forms_folder(entry)
            if not forms.exists():  # this load writes them: room for as much again as the entry
                files.evict(directory(), files.max_bytes() - len(buffer))
            WEIGHTS.keep_on_disk(buffer, forms)
            return cached
    start = time.perf_counter()
    optimized = build()
    source = _sources[network]  # found by _entry
    if time.perf_counter() - start + source.parse_seconds >= MIN_SECONDS and source.settled():
        _store(optimized, entry, source)
    return optimized


def _entry(network: Any, backends: Any, options: Any, extra: Any, registry: BackendRegistry) -> Path | None:
    """The cache file for this optimize, or None where it does not go through the cache."""
    source = _sources.get(network) if isinstance(network, Network) else None
    if source is None or not enabled():
        return None
    if not (isinstance(network, _FileNetwork) and not network.parsed) and not source.unchanged(network.graph):
        return None
    try:
        order = optimizer.preference_order(backends, registry)
        chosen = optimizer.OptimizerOptions() if options is None else options
        if not isinstance(chosen, optimizer.OptimizerOptions):
            return None
        chosen_backends = [registry.get(bid) for bid in order]
    except Exception:  # a bad argument: optimize itself reports it
        return None
    if not all(type(b).__module__.startswith(OWN_BACKENDS) for b in chosen_backends):
        return None  # another's backend: what it takes may hang on more than its class says
    described = [_describe(bid, backend) for bid, backend in zip(order, chosen_backends)]
    parts = [
        FORMAT,
        source.file,
        order,
        repr(chosen),
        described,
        _canonical(extra),
        _flowrt_stamp(),
        _machine(),
    ]
    text = json.dumps(parts, default=repr)
    if " at 0x" in text:  # something keyed by its address: would never be found again
        return None
    return source.folder / f"{source.prefix}-{hashlib.sha1(text.encode()).hexdigest()[:24]}.flowrt"


_warned: set[str] = set()


def _trusted(folder: Path, make: bool = False) -> bool:
    """Whether only you (or root) can write ``folder`` (made first with ``make``): entries
    others could plant are neither read nor written (warned once per folder)."""
    problem = (
        trusted_paths.private_directory(folder)
        if make
        else trusted_paths.untrusted_reason(folder, allow_sticky=True)
    )
    if problem is None:
        return True
    if str(folder) not in _warned:
        _warned.add(str(folder))
        # A cache that cannot be made (a read-only home) only costs time: said at INFO.
        level = logging.WARNING if os.path.isdir(folder) else logging.INFO
        logger.log(level, "not using the cache of optimized networks in %s: %s", folder, problem)
    return False


def _describe(bid: str, backend: Any) -> list[Any]:
    kind = type(backend)
    version = getattr(backend, "version", None)
    return [bid, f"{kind.__module__}.{kind.__qualname__}", repr(version), _canonical(backend.capabilities)]


def _canonical(value: Any) -> Any:
    """``value`` in a form whose text is the same in every process (sets sorted: their order
    follows the process's string hashing)."""
    if isinstance(value, dict):
        return sorted((repr(k), _canonical(v)) for k, v in value.items())
    if isinstance(value, (set, frozenset)):
        return sorted(repr(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return repr(value)


def _machine() -> list[Any]:
    return [platform.machine(), default_cpu_workers()]


def _store(optimized: OptimizedNetwork, entry: Path, source: _Source) -> None:
    if _trusted(entry.parent, make=True) and files.store(optimized, entry, source.prefix):
        source.write_initializers()
        files.evict(directory(), files.max_bytes())
