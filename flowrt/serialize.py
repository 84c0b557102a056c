"""Optimized networks saved as ``.flowrt`` files, and loaded back without ONNX parsing or optimization.

::

    flowrt.save(flowrt.optimize(net, backends=["CpuRef"]), "model.flowrt")
    optimized = flowrt.load("model.flowrt")       # an OptimizedNetwork, ready for Runtime.load

The file, format version 1 (integers little-endian)::

    offset  size  field
    0       8     magic b"\\x89FLOWRT\\n"
    8       2     format version (u16): 1
    10      4     Backend API version of the writer (flowrt.registry.BACKEND_API_VERSION),
                  major and minor (u16 each)
    14      2     reserved, 0
    16      8     length of the whole file (u64)
    24      8     length M of the metadata (u64)
    32      4     CRC-32 (zlib) of every byte of the file but these four
    36      28    version of the flowrt that wrote it, ASCII, NUL-padded
    64      M     metadata: one msgpack map
    D             data, D = 64 + M rounded up to a multiple of 64 (zeros between)

The magic, the format version and the writer's flowrt version keep their places in every
format version, so any flowrt tells a foreign file from a newer one. The metadata map holds
the network as ``flowrt.engine.graph.encoding`` writes it ("backends", "options", "passes",
"layers" in topological order, "graph_order"; its docstring gives the value tags), and:

    "tensors"   [{"dtype": "float32", "shape": [...], "offset": int, "nbytes": int}]: raw
                little-endian C-order bytes at D + offset (a multiple of 64); Constant weights
                and any array in a descriptor, each array once. The dtype is a DataType's
                value; ml_dtypes' types ("bfloat16", "float8_e4m3fn", "int4", ...) are kept
                one element a byte (two for bfloat16), never packed
    "prepared"  {backend id: {"version": [major, minor], "layers": {layer name: tensor}}}:
                data a backend made ahead of time for its layers (uint8 tensors); loaded
                only for a backend registered with that same version

Loading maps the file into memory (or reads it once into one 64-byte-aligned buffer,
``mmap=False``; ``flowrt.file_buffers``): every array is a read-only view of it, never a
copy. The checks run in this order: magic ("not a flowrt file"), format version ("newer
format"), declared length ("truncated"), checksum and header fields ("corrupt"), the Backend
API version ("incompatible"), then the metadata, unpacked by msgpack under limits no larger
than the file (str map keys, no ext types, no hooks) and decoded field by field ("corrupt",
naming the field), and last every layer is checked against its backend
(``flowrt.engine.graph.recheck``). Each failure is a ModelLoadError naming the file.
Nothing in a file is ever run as code.
"""

from __future__ import annotations

import logging
import os
import stat
import struct
import threading
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import msgpack
import numpy as np

from flowrt.engine.graph.encoding import (
    ARRAY_DTYPES,
    decode_network,
    encode_network,
    expect_field,
    expect_type,
)
from flowrt.engine.graph.layers.subgraph_body import subgraphs_of
from flowrt.engine.graph.optimizer import OptimizedNetwork
from flowrt.engine.graph.recheck import recheck
from flowrt.errors import FlowrtError, ModelLoadError
from flowrt.file_buffers import ALIGNMENT, read_whole, release_pages
from flowrt.registry import BACKEND_API_VERSION, BackendRegistry, backend_registry
from flowrt.types import DataType

logger = logging.getLogger(__name__)

MAGIC = b"\x89FLOWRT\n"
FORMAT_VERSION = 1
MAX_RANK = 64  # numpy's own limit
HEADER = struct.Struct("<8sHHHHQQI28s")  # the 64-byte header above
CHECKSUM_FIELD = slice(32, 36)

# {backend id: ((major, minor), {layer name: bytes-like})}
Prepared = Mapping[str, tuple[tuple[int, int], Mapping[str, Any]]]


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def _flowrt_version() -> str:
    from flowrt import __version__  # at call time: the package imports this module as it starts

    return __version__


class _TensorWriter:
    """Lays arrays out for the data section, each once, at 64-byte-aligned offsets."""

    def __init__(self) -> None:
        self.table: list[dict[str, Any]] = []
        self.chunks: list[tuple[int, np.ndarray]] = []
        self.size = 0
        self._seen: dict[int, tuple[int, np.ndarray]] = {}  # id -> (index, array kept alive)

    def store(self, array: np.ndarray, where: str) -> int:
        seen = self._seen.get(id(array))
        if seen is not None:
            return seen[0]
        if array.dtype.name not in ARRAY_DTYPES or array.dtype.fields is not None:
            raise FlowrtError(
                f"{where}: cannot save an array of dtype {array.dtype}; a .flowrt file holds "
                f"{', '.join(sorted(ARRAY_DTYPES))}"
            )
        data = array.astype(array.dtype.newbyteorder("<"), order="C", copy=False)  # keeps 0-d arrays 0-d
        offset = _align(self.size)
        entry = {"dtype": data.dtype.name, "shape": list(data.shape), "offset": offset, "nbytes": data.nbytes}
        self.table.append(entry)
        self.chunks.append((offset, data.reshape(-1).view(np.uint8)))
        self.size = offset + data.nbytes
        self._seen[id(array)] = (len(self.table) - 1, array)
        return len(self.table) - 1


def _encode_prepared(prepared: Prepared, optimized: OptimizedNetwork, store) -> dict[str, Any]:
    encoded = {}
    for bid, (version, blobs) in prepared.items():
        major, minor = (int(v) for v in version)
        layers = {}
        for name, blob in blobs.items():
            if name not in optimized.graph.layers:
                raise FlowrtError(f"prepared data of {bid} names layer {name!r}, which the network lacks")
            layers[str(name)] = store(np.frombuffer(blob, np.uint8), f"prepared[{bid!r}][{name!r}]")
        encoded[str(bid)] = {"version": [major, minor], "layers": layers}
    return encoded


def save(optimized: OptimizedNetwork, path: str | os.PathLike, *, prepared: Prepared | None = None) -> None:
    """Write ``optimized`` to ``path`` as a .flowrt file; an existing file is replaced atomically.

    ``prepared`` is data backends made ahead of time for their layers, ``{backend id: ((major,
    minor), {layer name: bytes})}``; it reaches a backend at load only when that backend is
    registered with the same version (default: ``optimized.prepared``). Raises FlowrtError
    for a value the format cannot hold (the message names the layer and field), a layer with
    subgraphs (If, Loop, Scan) included.
    """
    if not isinstance(optimized, OptimizedNetwork):
        raise FlowrtError(f"save expects an OptimizedNetwork, got {type(optimized).__name__}")
    _refuse_subgraphs(optimized, path)
    tensors = _TensorWriter()
    metadata = encode_network(optimized, tensors.store)
    chosen = optimized.prepared if prepared is None else prepared
    metadata["prepared"] = _encode_prepared(chosen, optimized, tensors.store)
    metadata["tensors"] = tensors.table
    try:
        body = msgpack.packb(metadata, use_bin_type=True)
    except (ValueError, TypeError, OverflowError) as e:
        raise FlowrtError(f"cannot save {os.fspath(path)}: {type(e).__name__}: {e}") from e
    data_start = _align(HEADER.size + len(body))
    pieces: list[Any] = [body, bytes(data_start - HEADER.size - len(body))]
    end = 0
    for offset, chunk in tensors.chunks:
        pieces += [bytes(offset - end), chunk]
        end = offset + chunk.nbytes
    writer = _flowrt_version().encode("ascii", "replace")[:28]
    header = HEADER.pack(
        MAGIC, FORMAT_VERSION, *BACKEND_API_VERSION, 0, data_start + end, len(body), 0, writer
    )
    checksum = zlib.crc32(header[CHECKSUM_FIELD.stop :], zlib.crc32(header[: CHECKSUM_FIELD.start]))
    for piece in pieces:
        checksum = zlib.crc32(piece, checksum)
    header = header[: CHECKSUM_FIELD.start] + struct.pack("<I", checksum) + header[CHECKSUM_FIELD.stop :]
    _write_atomically(Path(path), [header, *pieces])


def _refuse_subgraphs(optimized: OptimizedNetwork, path: str | os.PathLike) -> None:
    """FlowrtError naming the first layer with subgraphs (If, Loop, Scan): the format holds
    no subgraph yet, and a file without them would run something else."""
    for layer in optimized.graph.topological_order():
        if subgraphs_of(layer.descriptor):
            raise FlowrtError(
                f"cannot save {os.fspath(path)}: layer {layer.name!r} ({layer.kind}) runs subgraphs, which "
                "a .flowrt file cannot hold yet; keep the ONNX model and optimize it where it is loaded"
            )


def _write_atomically(path: Path, pieces: list[Any]) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with open(partial, "wb") as f:
            for piece in pieces:
                f.write(piece)
        os.replace(partial, path)
    except OSError as e:
        partial.unlink(missing_ok=True)
        raise FlowrtError(f"cannot write {path}: {e}") from e
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def is_flowrt_file(path: str | os.PathLike) -> bool:
    """True when ``path`` is named ``*.flowrt`` or is a regular file starting with the magic."""
    if os.fspath(path).endswith(".flowrt"):
        return True
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def load(
    path: str | os.PathLike, *, mmap: bool = True, registry: BackendRegistry | None = None
) -> OptimizedNetwork:
    """Read a .flowrt file written by :func:`save`: no ONNX parsing, no optimization.

    Arrays in the result are read-only views of the file mapped into memory: pages are read
    when first touched and shared with other processes that map the same file, as ONNX Runtime
    and OpenVINO do with their weight files. The file must then not be changed in place while
    the network is in use (``save`` replaces files whole, which is safe). With ``mmap=False``
    the file is read once into one buffer instead, and may then change freely. Prepared data
    is kept for backends registered in ``registry`` (default: the process registry) with the
    version that made it, and dropped (logged at INFO) for the others. Raises ModelLoadError for a missing, foreign, truncated, corrupt, newer or
    incompatible file, and for one with a layer its backend does not take as it stands (kind,
    tensors, fused activation: each backend in ``registry`` is asked, as ``optimize`` asks it).
    """
    return load_buffered(path, mmap=mmap, registry=registry)[0]


def load_buffered(
    path: str | os.PathLike, *, mmap: bool = True, registry: BackendRegistry | None = None
) -> tuple[OptimizedNetwork, np.ndarray]:
    """:func:`load`, and the buffer holding the whole file that the network's arrays view."""
    where = os.fspath(path)
    registry = registry or backend_registry()
    buffer = read_whole(where, mapped=mmap)
    try:
        network = _decode(buffer, where, registry, mmap)
    except ModelLoadError:
        raise
    except Exception as e:  # every malformation is a ModelLoadError, whatever it set off
        raise ModelLoadError(f"{where}: corrupt flowrt file: {type(e).__name__}: {e}") from e
    try:
        recheck(network, registry)
    except FlowrtError as e:
        raise ModelLoadError(f"{where}: {e}") from e
    return network, buffer


class _Header(NamedTuple):
    metadata_end: int
    data_start: int
    checksum: _Checksum


def _check_header(buffer: np.ndarray, where: str, mapped: bool) -> _Header:
    """The header's fields, checked; the contents' checksum is being computed (see
    :class:`_Checksum`), and a field found wrong past the lengths is reported as a checksum
    mismatch where the contents give another checksum."""
    size = len(buffer)
    head = bytes(buffer[: HEADER.size])
    if size == 0:
        raise ModelLoadError(f"model file {where} is empty")
    if head[:8] != MAGIC[: len(head[:8])]:
        raise ModelLoadError(
            f"{where}: not a flowrt file: it starts with {head[:8]!r}, a .flowrt file with {MAGIC!r}"
        )
    if size < HEADER.size:
        raise ModelLoadError(
            f"{where}: truncated flowrt file: it ends at byte {size}, inside the 64-byte header"
        )
    _, version, api_major, api_minor, reserved, length, metadata_length, checksum, writer_raw = HEADER.unpack(
        head
    )
    writer = writer_raw.rstrip(b"\0").decode("ascii", "replace")
    if version > FORMAT_VERSION:
        raise ModelLoadError(
            f"{where}: newer flowrt file format: format version {version} (written by flowrt {writer}); "
            f"flowrt {_flowrt_version()} reads format version {FORMAT_VERSION}: upgrade flowrt, or convert "
            "the model again with this one"
        )
    if size < length:
        raise ModelLoadError(
            f"{where}: truncated flowrt file: it holds {size} of the {length} bytes its header declares"
        )
    corrupt = f"{where}: corrupt flowrt file"
    if size > length:
        raise ModelLoadError(
            f"{corrupt}: {size - length} bytes follow the end its header declares (byte {length})"
        )
    computing = _Checksum(buffer, checksum, where, mapped)

    def refuse(message: str) -> NoReturn:
        computing.check()
        raise ModelLoadError(message)

    if version == 0 or reserved != 0:
        field = "format version (bytes 8-10)" if version == 0 else "reserved field (bytes 14-16)"
        refuse(f"{corrupt}: the {field} is 0x{version if version == 0 else reserved:x}")
    ours = BACKEND_API_VERSION
    if api_major != ours[0] or api_minor > ours[1]:
        refuse(
            f"{where}: incompatible flowrt file: written for Backend API {api_major}.{api_minor} by flowrt "
            f"{writer}; this flowrt provides {ours[0]}.{ours[1]}: convert the model again with this one"
        )
    metadata_end = HEADER.size + metadata_length
    if _align(metadata_end) > length:
        refuse(f"{corrupt}: the metadata length (bytes 24-32) is {metadata_length}, past the end of the file")
    return _Header(metadata_end, _align(metadata_end), computing)


class _Checksum:
    """The file's checksum, computed on a thread of its own while the metadata is decoded
    (zlib lets go of the GIL: a 100 MB file's 30 ms overlap the decoding)."""

    def __init__(self, buffer: np.ndarray, expected: int, where: str, mapped: bool) -> None:
        self._buffer, self._expected, self._where, self._mapped = buffer, expected, where, mapped
        self._computed: int | None = None
        self._thread = threading.Thread(target=self._compute, name="flowrt-checksum", daemon=True)
        self._thread.start()

    def _compute(self) -> None:
        with self._buffer.data as view:
            self._computed = zlib.crc32(view[CHECKSUM_FIELD.stop :], zlib.crc32(view[: CHECKSUM_FIELD.start]))
        if self._mapped:
            # Reading it mapped every page of the file into this process: let them go, so that
            # only what is used stays in its memory (a backend's transformed weights stand for
            # most weights, which are then never read).
            release_pages(self._buffer)

    def check(self) -> None:
        """ModelLoadError where the contents do not give the header's checksum."""
        self._thread.join()
        if self._computed != self._expected:
            computed = "nothing" if self._computed is None else f"{self._computed:#010x}"
            raise ModelLoadError(
                f"{self._where}: corrupt flowrt file: checksum mismatch: the header (bytes 32-36) says "
                f"{self._expected:#010x}, the contents give {computed}"
            )


def _decode(buffer: np.ndarray, where: str, registry: BackendRegistry, mapped: bool) -> OptimizedNetwork:
    header = _check_header(buffer, where, mapped)
    try:
        network = _decode_checked(buffer, header, where, registry)
    except Exception:
        header.checksum.check()  # damaged contents: say so, rather than what they set off
        raise
    header.checksum.check()
    return network


def _decode_checked(
    buffer: np.ndarray, header: _Header, where: str, registry: BackendRegistry
) -> OptimizedNetwork:
    section = f"metadata (bytes 64-{header.metadata_end})"
    limit = header.metadata_end - HEADER.size
    try:
        with buffer.data as view:
            metadata = msgpack.unpackb(
                view[HEADER.size : header.metadata_end],
                raw=False,
                strict_map_key=True,
                use_list=True,
                max_str_len=limit,
                max_bin_len=limit,
                max_array_len=limit,
                max_map_len=limit,
                max_ext_len=0,
            )
    except Exception as e:
        raise ModelLoadError(f"{where}: corrupt flowrt file: {section} is not valid msgpack: {e}") from e
    try:
        root = expect_type(metadata, dict, "metadata")
        views = _tensor_views(expect_field(root, "tensors", list, "metadata"), buffer, header.data_start)

        def fetch(index: int, at: str) -> np.ndarray:
            if not 0 <= index < len(views):
                raise ModelLoadError(f"{at}: tensor {index} is not in the table of {len(views)}")
            return views[index]

        network = decode_network(root, fetch)
        prepared = _decode_prepared(expect_field(root, "prepared", dict, "metadata"), network, fetch)
    except Exception as e:
        detail = str(e) if isinstance(e, ModelLoadError) else f"{type(e).__name__}: {e}"
        raise ModelLoadError(f"{where}: corrupt flowrt file: {section}: {detail}") from e
    network.prepared = _matching(prepared, registry, where)
    return network


def _tensor_views(table: list, buffer: np.ndarray, data_start: int) -> list[np.ndarray]:
    views = []
    for i, entry in enumerate(table):
        where = f"tensors[{i}]"
        expect_type(entry, dict, where)
        name = expect_field(entry, "dtype", str, where)
        shape = expect_field(entry, "shape", list, where)
        offset = expect_field(entry, "offset", int, where)
        nbytes = expect_field(entry, "nbytes", int, where)
        if name not in ARRAY_DTYPES:
            raise ModelLoadError(f"{where}.dtype: {name!r} is not one of {', '.join(sorted(ARRAY_DTYPES))}")
        dtype = DataType(name).numpy.newbyteorder("<")  # ml_dtypes' by attribute, not name
        if len(shape) > MAX_RANK or any(type(d) is not int or d < 0 for d in shape):
            raise ModelLoadError(
                f"{where}.shape: expected up to {MAX_RANK} non-negative ints, found {shape[:8]}"
            )
        count = 0 if 0 in shape else 1
        for d in shape:
            count = min(count * d, len(buffer) + 1)  # no bigger than the file: no huge products
        if nbytes != count * dtype.itemsize:
            raise ModelLoadError(
                f"{where}: {nbytes} bytes cannot hold a {name} array of shape {tuple(shape)}"
            )
        if offset < 0 or offset % ALIGNMENT or data_start + offset + nbytes > len(buffer):
            raise ModelLoadError(
                f"{where}: bytes {offset}-{offset + nbytes} of the data section are not an aligned "
                f"range inside its {len(buffer) - data_start} bytes"
            )
        start = data_start + offset
        views.append(buffer[start : start + nbytes].view(dtype).reshape(shape))
    return views


def _decode_prepared(data: dict, network: OptimizedNetwork, fetch) -> dict:
    prepared = {}
    for bid, entry in data.items():
        where = f"prepared[{bid!r}]"
        expect_type(bid, str, where)
        version = expect_field(expect_type(entry, dict, where), "version", list, where)
        if len(version) != 2 or any(type(v) is not int for v in version):
            raise ModelLoadError(f"{where}.version: expected [major, minor], found {version[:4]}")
        blobs = {}
        for name, index in expect_field(entry, "layers", dict, where).items():
            at = f"{where}.layers[{name!r}]"
            if type(name) is not str or name not in network.graph.layers:
                raise ModelLoadError(f"{at}: the network has no such layer")
            blob = fetch(expect_type(index, int, at), at)
            if blob.dtype != np.uint8 or blob.ndim != 1:
                raise ModelLoadError(
                    f"{at}: prepared data is a 1-D uint8 tensor, found {blob.dtype}{blob.shape}"
                )
            blobs[name] = memoryview(blob)
        prepared[bid] = ((version[0], version[1]), blobs)
    return prepared


def _matching(prepared: dict, registry: BackendRegistry, where: str) -> dict:
    """The prepared data whose backend is registered with the version that made it."""
    kept = {}
    for bid, (version, blobs) in prepared.items():
        try:
            registered = tuple(registry.get(bid).version) if registry.is_registered(bid) else None
        except FlowrtError as e:
            registered, reason = None, str(e)
        else:
            reason = (
                "it is not registered" if registered is None else f"its registered version is {registered}"
            )
        if registered == version:
            kept[bid] = (version, blobs)
        else:
            logger.info("%s: prepared data of %s %s.%s not used: %s", where, bid, *version, reason)
    return kept


__all__ = ["FORMAT_VERSION", "MAGIC", "is_flowrt_file", "load", "save"]
