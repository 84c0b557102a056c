"""numba's disk cache of CpuAcc's kernels goes stale when any source file of the package
changes, not only the kernel's own: a kernel's cached code holds its callees' code."""

from __future__ import annotations

import os
import subprocess
import sys

from flowrt.workers.cpu.acc import cache_stamp

# Compiles (or loads from the cache) one small function of the package and prints whether it
# came from the cache; with "changed", as if another source file of the package had changed.
_SCRIPT = """
import sys
from numba import types
from flowrt.workers.cpu.acc import cache_stamp

if sys.argv[1] == "changed":  # before any function of the package is jitted
    cache_stamp._PackageStamp._digest = "another source tree"
from flowrt.workers.cpu.acc import calls

calls.native_address(calls._parallel_tasks, (types.int64,) * 4)
print(sum(calls._parallel_tasks.stats.cache_hits.values()))
"""


def _cache_hit(cache_dir, mode: str) -> bool:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir))
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode], env=env, capture_output=True, text=True, check=True
    )
    return int(done.stdout.split()[-1]) > 0


def test_a_change_to_any_source_of_the_package_makes_its_kernels_compile_again(tmp_path):
    assert not _cache_hit(tmp_path, "same")  # an empty cache
    assert _cache_hit(tmp_path, "same")
    assert not _cache_hit(tmp_path, "changed")


def test_the_digest_follows_every_source_file_of_the_package(tmp_path, monkeypatch):
    before = cache_stamp.sources_digest()
    assert before == cache_stamp.sources_digest()
    monkeypatch.setattr(cache_stamp, "ROOT", tmp_path)
    (tmp_path / "a.py").write_text("x = 1\n")
    one = cache_stamp.sources_digest()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    assert cache_stamp.sources_digest() not in (one, before)


# Loads (or compiles) one small function of the package and prints whether it came from the
# cache and whether numba's implementations (what only compiling needs) were imported.
_LOADS = """
import sys
from numba import types
from flowrt.workers.cpu.acc import calls

calls.native_address(calls._parallel_tasks, (types.int64,) * 4)
print(sum(calls._parallel_tasks.stats.cache_hits.values()), "numba.np.arraymath" in sys.modules)
"""


def test_a_process_whose_kernels_are_cached_never_loads_what_only_compiling_needs(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))

    def run() -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", _LOADS], env=env, capture_output=True, text=True, check=True
        )
        return done.stdout.split()

    assert run() == ["0", "True"]  # compiled: numba's compiler loaded its implementations
    assert run() == ["1", "False"]  # loaded from the cache, with numba's runtime alone


# Imports every kernel module of the package (each jits its functions with cache=True) and
# counts numba's writability probes (a temporary file made in the cache directory).
_PROBES = """
import importlib, pkgutil, sys, tempfile
probes = []
real = tempfile.TemporaryFile
def counting(*args, **kwargs):
    probes.append(kwargs.get("dir"))
    return real(*args, **kwargs)
tempfile.TemporaryFile = counting
import flowrt.workers.cpu.acc.kernels
package = sys.modules["flowrt.workers.cpu.acc.kernels"]
for module in pkgutil.iter_modules(package.__path__):
    importlib.import_module(f"{package.__name__}.{module.name}")
from flowrt.workers.cpu.acc import preload
print(len(probes), len(set(probes)), len(list(preload._cached_dispatchers())))
"""


def test_the_cache_directory_is_probed_once_per_directory_not_once_per_function(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", _PROBES], env=env, capture_output=True, text=True, check=True
    )
    probes, directories, functions = map(int, done.stdout.split())
    assert functions > 100
    assert probes == directories and 1 <= directories <= 3


def test_a_cache_directory_removed_meanwhile_is_made_again(tmp_path, monkeypatch):
    from numba.core import config

    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path / "cache"))
    locator = cache_stamp._UserDirLocator.from_function(cache_stamp.stamp, cache_stamp.__file__)
    path = locator.get_cache_path()
    assert os.path.isdir(path)
    os.rmdir(path)
    locator.ensure_cache_path()  # probed before: not probed again, but made again
    assert os.path.isdir(path) and path in cache_stamp._WRITABLE


# Imports the package as a load does (``calls`` first), then every module of it, and prints
# the cached functions numba would keep elsewhere than the package's cache (unstamped).
_STRAYS = """
import importlib, pkgutil, sys
from numba.core.caching import NullCache
from numba.core.dispatcher import Dispatcher
from flowrt.workers.cpu.acc import calls, cache_stamp
import flowrt.workers.cpu.acc as package
for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
    importlib.import_module(module.name)
for name, module in list(sys.modules.items()):
    if name.startswith(package.__name__):
        for attr, value in vars(module).items():
            if isinstance(value, Dispatcher) and value.py_func.__module__ == name:
                cache = value._cache
                if not isinstance(cache, NullCache) and not cache_stamp.is_ours(cache):
                    print(f"{name}.{attr}")
print("checked")
"""


def test_every_cached_function_of_the_package_is_kept_in_its_stamped_cache(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", _STRAYS], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["checked"]
