"""Kernels loaded from numba's cache without parsing their bitcode until something links them.

numba caches a function as its object code and, beside it, the LLVM bitcode of its module,
kept for linking the function into another one compiled later. Loading a function from the
cache parses that bitcode into a module at once (``CPUCodeLibrary._unserialize``), only to
read the names of the symbols it defines (the engine answers a pointer lookup only for a name
it has seen defined) and to keep it in memory for a link that a loaded network never makes:
its kernels call each other by address. Parsing was a third of loading resnet50's 41
functions at a fresh process's load (40-60 ms of 140-180).

Inside :func:`deferred`, a library loaded from object code takes its defined names from the
object file's symbol table instead, and parses its bitcode the first time something asks for
the module (a later compile that links it). Object files other than 64-bit little-endian ELF
are loaded the usual way.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import llvmlite.binding as ll
from numba.core import codegen

_ELF_MAGIC = b"\x7fELF\x02\x01"  # 64-bit, little-endian
_SECTION = struct.Struct("<IIQQQQIIQQ")  # an ELF64 section header
_SYMBOL = struct.Struct("<IBBHQQ")  # an ELF64 symbol
_SYMTAB = 2  # a section holding the symbol table
_NAMED_KINDS = {0, 1, 2}  # STT_NOTYPE, STT_OBJECT, STT_FUNC: not sections nor files

_lock = threading.Lock()


def defined_symbols(object_code: bytes) -> set[str] | None:
    """The names the ELF object ``object_code`` defines (functions and data, local ones too,
    as numba reads them off a module), or None where it is not 64-bit little-endian ELF."""
    if not object_code.startswith(_ELF_MAGIC):
        return None
    view = memoryview(object_code)
    (section_offset,) = struct.unpack_from("<Q", view, 0x28)
    entry_size, count = struct.unpack_from("<HH", view, 0x3A)
    sections = [_SECTION.unpack_from(view, section_offset + i * entry_size) for i in range(count)]
    names: set[str] = set()
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, _entsize in sections:
        if kind != _SYMTAB:
            continue
        strings = sections[link][4]
        for name_at, info, _other, index, _value, _size in _SYMBOL.iter_unpack(view[offset : offset + size]):
            if name_at and index and (info & 0xF) in _NAMED_KINDS:
                end = object_code.index(b"\0", strings + name_at)
                names.add(object_code[strings + name_at : end].decode())
    return names


class _Library(codegen.JITCodeLibrary):
    """A library loaded from object code whose bitcode is parsed when first asked for."""

    _deferred_bitcode: bytes | None = None
    _parsed: Any = None

    @property
    def _shared_module(self) -> Any:
        with _lock:
            if self._parsed is None and self._deferred_bitcode is not None:
                self._parsed = ll.parse_bitcode(self._deferred_bitcode)
                self._deferred_bitcode = None
            return self._parsed

    @_shared_module.setter
    def _shared_module(self, module: Any) -> None:
        self._parsed = module


def _unserialize(cls: type, codegen_: Any, state: tuple[str, str, Any]) -> Any:
    name, kind, data = state
    symbols = defined_symbols(data[0]) if kind == "object" else None
    created = codegen_.create_library(name) if symbols is not None else None
    if symbols is None or type(created) is not codegen.JITCodeLibrary:
        return _ORIGINAL.__get__(None, cls)(codegen_, state)
    object_code, shared_bitcode = data
    created.__class__ = _Library
    library = cast(_Library, created)
    library.enable_object_caching()
    library._set_compiled_object(object_code)
    library._deferred_bitcode = shared_bitcode
    library._finalize_final_module()
    codegen_._engine._defined_symbols |= symbols
    return library


_ORIGINAL = (
    codegen.JITCodeLibrary.__dict__.get("_unserialize") or codegen.CPUCodeLibrary.__dict__["_unserialize"]
)
_users = 0  # the deferred() blocks open, on any thread


@contextmanager
def deferred() -> Iterator[None]:
    """Functions loaded from numba's cache meanwhile (on any thread) parse their bitcode
    only when it is asked for."""
    global _users
    with _lock:
        _users += 1
        codegen.JITCodeLibrary._unserialize = classmethod(_unserialize)  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                codegen.JITCodeLibrary._unserialize = _ORIGINAL  # type: ignore[method-assign]
