"""Functions loaded from numba's cache with their bitcode parsed only when asked for
(``lazy_bitcode.py``): the names an object file defines are the names its bitcode defines, a
function so loaded runs, and its module is there for a later link."""

import os
import subprocess
import sys

import llvmlite.binding as ll
from numba import njit, types
from numba.core import codegen

from flowrt.workers.cpu.acc import lazy_bitcode

_MODULE = """
import numpy as np
from numba import njit

@njit(cache=True)
def scaled_sum(x, scale):
    total = 0.0
    for v in x:
        total += v * scale
    return total

@njit(cache=True)
def twice_scaled_sum(x):
    return 2.0 * scaled_sum(x, 1.5)
"""

# A fresh process loads scaled_sum from the cache inside deferred(): the bitcode is not parsed
# at the load, the pointer lookups that calling it makes succeed, and a function compiled
# afterwards that calls it links its module, parsed then.
_LOAD = """
import numpy as np
from numba.core import codegen
from flowrt.workers.cpu.acc import lazy_bitcode
import kernels

parsed = []
parse = lazy_bitcode.ll.parse_bitcode
lazy_bitcode.ll.parse_bitcode = lambda data: parsed.append(1) or parse(data)
with lazy_bitcode.deferred():
    kernels.scaled_sum(np.arange(2.0), 1.0)
library = kernels.scaled_sum.overloads[kernels.scaled_sum.signatures[0]].library
restored = codegen.JITCodeLibrary._unserialize.__func__ is not lazy_bitcode._unserialize
print(type(library).__name__, len(parsed), sum(kernels.scaled_sum.stats.cache_hits.values()))
print(kernels.scaled_sum(np.arange(4.0), 2.0))
print(kernels.twice_scaled_sum(np.arange(4.0)), len(parsed), restored)
"""


def test_the_names_an_object_file_defines_are_those_its_bitcode_defines():
    @njit
    def saxpy(a, x, y):
        for i in range(x.size):
            y[i] += a * x[i]

    vector = types.Array(types.float32, 1, "C")
    saxpy.compile((types.float32, vector, vector))
    library = saxpy.overloads[saxpy.signatures[0]].library
    _, kind, (object_code, bitcode) = library.serialize_using_object_code()
    module = ll.parse_bitcode(bitcode)
    defined = {
        g.name for gs in (module.functions, module.global_variables) for g in gs if not g.is_declaration
    }
    assert kind == "object"
    assert lazy_bitcode.defined_symbols(object_code) == defined
    assert any(name.startswith("cfunc.") for name in defined)


def test_an_object_file_that_is_not_elf64_is_left_to_numba():
    assert lazy_bitcode.defined_symbols(b"\xcf\xfa\xed\xfe" + bytes(60)) is None
    assert lazy_bitcode.defined_symbols(b"\x7fELF\x01\x01" + bytes(60)) is None


def test_a_function_loaded_from_the_cache_runs_and_links_later(tmp_path):
    (tmp_path / "kernels.py").write_text(_MODULE)
    env = dict(os.environ, PYTHONPATH=str(tmp_path), NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    compile_ = "import numpy as np, kernels; print(kernels.scaled_sum(np.arange(4.0), 2.0))"
    first = subprocess.run(
        [sys.executable, "-c", compile_], capture_output=True, text=True, env=env, timeout=300
    )
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.split() == ["12.0"]

    done = subprocess.run([sys.executable, "-c", _LOAD], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    kind, parsed_at_load, hits, result, linked, parsed_later, restored = done.stdout.split()
    assert (kind, parsed_at_load, hits) == ("_Library", "0", "1")
    assert float(result) == 12.0
    assert (float(linked), parsed_later, restored) == (18.0, "1", "True")
    assert codegen.JITCodeLibrary._unserialize.__func__ is not lazy_bitcode._unserialize
