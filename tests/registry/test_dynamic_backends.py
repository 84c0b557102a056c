"""Dynamic backends: Arm NN's DynamicBackend rules (naming, version, paths, skipping) in Python."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from dynbackends import assert_runs, backend_source, warnings_about, write_backend

import flowrt
import flowrt.registry
import flowrt.registry.dynamic as dynamic
from flowrt.registry import backend_registry
from flowrt.registry.dynamic import (
    DynamicBackendReport,
    LoadedBackend,
    SkippedBackend,
    check_backend_version,
    load_dynamic_backends,
)

# -- naming rule ------------------------------------------------------------------------------
# (name in the scanned directory, what it is, outcome). "link:X" is a symbolic link to a file X
# outside the scanned directory; the link's own name is what counts, as in Arm NN.
NAMING_TABLE = [
    ("Arm_GpuAcc_backend.py", "file", "loaded"),
    ("A_B_backend.py", "file", "loaded"),
    ("arm2_Gpu3Acc_backend.py", "file", "loaded"),
    ("_GpuAcc_backend.py", "file", "ignored"),
    ("Arm__backend.py", "file", "ignored"),
    ("__backend.py", "file", "ignored"),
    ("Arm_Gpu-Acc_backend.py", "file", "ignored"),
    ("Arm-Ltd_GpuAcc_backend.py", "file", "ignored"),
    ("Arm.Ltd_GpuAcc_backend.py", "file", "ignored"),
    ("Arm_Gpu Acc_backend.py", "file", "ignored"),
    ("Ärm_GpuAcc_backend.py", "file", "ignored"),
    ("Arm_Gpu_Acc_backend.py", "file", "ignored"),
    ("ArmGpuAcc_backend.py", "file", "ignored"),
    ("Arm_GpuAcc_backend.so", "file", "ignored"),
    ("Arm_GpuAcc_backend.PY", "file", "ignored"),
    ("Arm_GpuAcc_Backend.py", "file", "ignored"),
    ("Arm_GpuAcc_backend.py.bak", "file", "ignored"),
    ("Arm_GpuAcc_backend_extra.py", "file", "ignored"),
    ("Arm_GpuAcc__backend.py", "file", "ignored"),
    ("Arm_GpuAccbackend.py", "file", "ignored"),
    ("Arm_GpuAcc.py", "file", "ignored"),
    (".Arm_GpuAcc_backend.py", "file", "ignored"),
    ("Arm_GpuAcc_backend.py", "link:Arm_GpuAcc_backend.py", "loaded"),
    ("Arm_GpuAcc_backend.py", "link:plugin.py", "loaded"),
    ("Arm_GpuAcc_backend.py", "link:Arm_Gpu-Acc_backend.py", "loaded"),
    ("Arm_GpuAcc_link.py", "link:Arm_GpuAcc_backend.py", "ignored"),
    ("Arm_Gpu-Acc_backend.py", "link:Arm_GpuAcc_backend.py", "ignored"),
    ("Arm_GpuAcc_backend.py", "dangling link", "skipped: dangling symbolic link"),
    ("Arm_GpuAcc_backend.py", "directory", "skipped: not a regular file"),
]


def make_entry(tmp_path: Path, name: str, what: str) -> tuple[Path, Path]:
    scanned, elsewhere = tmp_path / "scanned", tmp_path / "elsewhere"
    scanned.mkdir()
    entry = scanned / name
    if what == "file":
        write_backend(scanned, name)
    elif what.startswith("link:"):
        entry.symlink_to(write_backend(elsewhere, what.removeprefix("link:")))
    elif what == "dangling link":
        entry.symlink_to(elsewhere / "missing.py")
    else:
        entry.mkdir()
    return scanned, entry


@pytest.mark.parametrize(("name", "what", "outcome"), NAMING_TABLE)
def test_backend_file_naming_rule(tmp_path, registry, caplog, name, what, outcome):
    scanned, entry = make_entry(tmp_path, name, what)
    report = load_dynamic_backends(registry, [scanned])
    assert report.paths == (str(scanned),)
    if outcome == "loaded":
        assert report.found == (str(entry),)
        assert report.loaded == (LoadedBackend("Test_Tiny", (1, 0), str(entry)),)
        assert report.skipped == ()
        assert registry.is_registered("Test_Tiny")
    elif outcome == "ignored":
        assert report == DynamicBackendReport(paths=(str(scanned),))
        assert not caplog.records
    else:
        reason = outcome.removeprefix("skipped: ")
        assert report.found == (str(entry),)
        assert report.loaded == ()
        assert [(s.source, reason in s.reason) for s in report.skipped] == [(str(entry), True)]
        assert any(reason in m for m in warnings_about(caplog, entry))


def test_two_links_to_one_file_load_it_once(tmp_path, registry, caplog):
    target = write_backend(tmp_path / "elsewhere", "plugin.py")
    scanned = tmp_path / "scanned"
    scanned.mkdir()
    (scanned / "A_One_backend.py").symlink_to(target)
    (scanned / "A_Two_backend.py").symlink_to(target)
    report = load_dynamic_backends(registry, [scanned])
    assert report.ids == ["Test_Tiny"]
    assert report.skipped == (
        SkippedBackend(str(scanned / "A_Two_backend.py"), f"the same file as {scanned / 'A_One_backend.py'}"),
    )


# -- version rule ----------------------------------------------------------------------------
# (what get_version() returns, the error when refused; None when compatible with API 1.0)
VERSION_TABLE = [
    ((1, 0), None),
    ([1, 0], None),
    ((1, 1), "not compatible with flowrt's Backend API 1.0"),
    ((1, 10), "not compatible with flowrt's Backend API 1.0"),
    ((0, 9), "not compatible with flowrt's Backend API 1.0"),
    ((0, 0), "not compatible with flowrt's Backend API 1.0"),
    ((2, 0), "not compatible with flowrt's Backend API 1.0"),
    ((1, -1), "must not be negative"),
    ("1.0", "two ints"),
    (1.0, "two ints"),
    ((1,), "two ints"),
    ((1, 0, 0), "two ints"),
    ((1.0, 0), "two ints"),
    (("1", "0"), "two ints"),
    ((True, False), "two ints"),
    (None, "two ints"),
]


@pytest.mark.parametrize(("version", "error"), VERSION_TABLE)
def test_backend_version_rule(tmp_path, registry, caplog, version, error):
    path = write_backend(tmp_path, source=backend_source(version=version))
    report = load_dynamic_backends(registry, [tmp_path])
    if error is None:
        assert check_backend_version(version) == (1, 0)
        assert report.ids == ["Test_Tiny"]
    else:
        with pytest.raises(ValueError, match=error):
            check_backend_version(version)
        assert report.ids == []
        assert error in report.skipped[0].reason
        assert any(error in m for m in warnings_about(caplog, path))


@pytest.mark.parametrize(
    ("version", "api", "compatible"),
    [((1, 1), (1, 2), True), ((1, 2), (1, 2), True), ((1, 3), (1, 2), False), ((2, 0), (2, 0), True)],
)
def test_minor_may_be_at_most_the_runtime_api_minor(
    tmp_path, registry, monkeypatch, version, api, compatible
):
    monkeypatch.setattr(flowrt.registry, "BACKEND_API_VERSION", api)
    write_backend(tmp_path, source=backend_source(version=version))
    assert load_dynamic_backends(registry, [tmp_path]).ids == (["Test_Tiny"] if compatible else [])


# -- invalid backends are skipped with a warning, and the runtime still runs -------------------
PARTIAL = "from fakes import PartialBackend\n"
INVALID_TABLE = [
    ("import raises", "raise RuntimeError('no licence')", "import raised RuntimeError: no licence"),
    ("syntax error", "def broken(:\n    pass", "import raised SyntaxError"),
    ("exits on import", "import sys\nsys.exit(3)", "import raised SystemExit: 3"),
    ("empty module", "", "does not define get_backend_id(), get_version(), backend_factory()"),
    (
        "missing factory",
        "def get_backend_id(): return 'X'\ndef get_version(): return (1, 0)",
        "does not define backend_factory()",
    ),
    ("id not callable", backend_source().replace("def get_backend_id():", "get_backend_id = 'Test_Tiny'\ndef _x():"), "get_backend_id is not callable"),
    ("id raises", backend_source().replace("return BACKEND_ID", "raise ValueError('no id')"), "get_backend_id() raised ValueError: no id"),
    ("version raises", backend_source(version="oops").replace("return 'oops'", "1 / 0"), "get_version() raised ZeroDivisionError"),
    ("factory raises", backend_source(factory="open('/nonexistent/device')"), "backend_factory() raised FileNotFoundError"),
    ("empty id", backend_source(backend_id=""), "get_backend_id() must return a non-empty str, got ''"),
    ("id not a str", backend_source().replace("return BACKEND_ID", "return 42"), "must return a non-empty str, got 42"),
    ("incompatible version", backend_source(version=(2, 0)), "version 2.0 is not compatible"),
    ("factory returns None", backend_source(factory="None"), "returned a NoneType, not a flowrt backend: it lacks id, version"),
    ("factory returns a plain object", backend_source(factory="object()"), "not a flowrt backend: it lacks id, version, capabilities"),
    (
        "factory returns half a backend",
        backend_source(factory="type('Half', (), {'id': BACKEND_ID, 'version': (1, 0), 'capabilities': {}, 'layer_support': 1})()"),
        "returned a Half, not a flowrt backend: it lacks layer_support, optimize_subgraph, create_memory_manager, create_workload_factory",
    ),
    ("factory id differs", backend_source(factory="PartialBackend('Other', set())"), "made a backend with id 'Other', not 'Test_Tiny'"),
    ("id already registered", backend_source(backend_id="CpuRef"), "backend id 'CpuRef' is already registered"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "source", "reason"), INVALID_TABLE, ids=[row[0] for row in INVALID_TABLE])
async def test_invalid_backend_is_skipped_with_a_warning(tmp_path, registry, caplog, case, source, reason):
    path = write_backend(tmp_path, "Bad_Case_backend.py", source)
    write_backend(tmp_path, "Good_Case_backend.py", backend_source("Good_Case"))
    async with flowrt.Runtime(registry, backend_paths=[tmp_path]) as rt:
        report = rt.dynamic_backends
        assert report.found == (str(path), str(tmp_path / "Good_Case_backend.py"))
        assert report.ids == ["Good_Case"]
        assert [s.source for s in report.skipped] == [str(path)]
        assert reason in report.skipped[0].reason
        assert [m for m in warnings_about(caplog, path) if reason in m]
        await assert_runs(rt)
        await assert_runs(rt, ("Good_Case",))
    assert registry.ids() == backend_registry().ids()


async def test_second_backend_with_the_same_id_is_skipped(tmp_path, registry, caplog):
    first = write_backend(tmp_path / "a", "A_One_backend.py")
    write_backend(tmp_path / "a", "A_Two_backend.py")
    write_backend(tmp_path / "b", "A_Three_backend.py")
    async with flowrt.Runtime(registry, backend_paths=[tmp_path / "a", tmp_path / "b"]) as rt:
        assert rt.dynamic_backends.loaded == (LoadedBackend("Test_Tiny", (1, 0), str(first)),)
        for name in ("a/A_Two_backend.py", "b/A_Three_backend.py"):
            reason = f"backend id 'Test_Tiny' was already loaded from {first}"
            assert SkippedBackend(str(tmp_path / name), reason) in rt.dynamic_backends.skipped
            assert warnings_about(caplog, tmp_path / name)
        await assert_runs(rt, ("Test_Tiny",))


def test_module_is_imported_by_path_under_a_private_name(tmp_path):
    import sys

    path = write_backend(tmp_path, source=backend_source() + "import sys\nSEEN_SYS_PATH = list(sys.path)\n")
    sys_path, modules = list(sys.path), set(sys.modules)
    first, second = dynamic._import_file(path), dynamic._import_file(path)
    assert first.__name__ != second.__name__
    assert first.__name__.startswith("_flowrt_dynamic_backend_")
    assert str(tmp_path) not in first.SEEN_SYS_PATH
    assert sys.path == sys_path
    assert set(sys.modules) - modules <= {"fakes"}


# -- paths -------------------------------------------------------------------------------------
PATH_TABLE = [
    ("does not exist", lambda tmp: str(tmp / "missing"), "the path does not exist"),
    ("is a file", lambda tmp: str(write_backend(tmp / "file")), "the path is not a directory"),
    ("is relative", lambda tmp: "tests", "the path is not absolute"),
    ("is relative to here", lambda tmp: ".", "the path is not absolute"),
]


@pytest.mark.parametrize("source", ["argument", "environment"])
@pytest.mark.parametrize(("case", "make", "reason"), PATH_TABLE, ids=[row[0] for row in PATH_TABLE])
async def test_invalid_backend_path_is_skipped(
    tmp_path, registry, caplog, monkeypatch, source, case, make, reason
):
    bad, good = make(tmp_path), tmp_path / "good"
    write_backend(good)
    if source == "argument":
        rt = flowrt.Runtime(registry, backend_paths=[bad, good])
    else:
        monkeypatch.setenv(dynamic.BACKEND_PATHS_ENV, f"{bad}{os.pathsep}{good}")
        rt = flowrt.Runtime(registry)
    async with rt:
        assert rt.dynamic_backends.paths == (str(good),)
        assert rt.dynamic_backends.skipped == (SkippedBackend(bad, reason),)
        assert warnings_about(caplog, bad) == [f"skipping backend path {bad}: {reason}"]
        await assert_runs(rt, ("Test_Tiny",))


async def test_backend_paths_override_the_environment(tmp_path, registry, monkeypatch):
    write_backend(tmp_path / "env", source=backend_source("From_Env"))
    write_backend(tmp_path / "arg", source=backend_source("From_Arg"))
    monkeypatch.setenv(dynamic.BACKEND_PATHS_ENV, f"{os.pathsep}{tmp_path / 'env'}{os.pathsep}")
    assert flowrt.Runtime(registry.copy()).dynamic_backends.ids == ["From_Env"]
    assert flowrt.Runtime(registry.copy(), backend_paths=[tmp_path / "arg"]).dynamic_backends.ids == [
        "From_Arg"
    ]
    assert flowrt.Runtime(registry.copy(), backend_paths=str(tmp_path / "arg")).dynamic_backends.ids == [
        "From_Arg"
    ]
    assert flowrt.Runtime(registry.copy(), backend_paths=[]).dynamic_backends == DynamicBackendReport()


def test_a_directory_named_twice_is_searched_once(tmp_path, registry):
    write_backend(tmp_path / "dir")
    (tmp_path / "alias").symlink_to(tmp_path / "dir")
    report = load_dynamic_backends(registry, [tmp_path / "dir", tmp_path / "alias", tmp_path / "dir"])
    assert report.paths == (str(tmp_path / "dir"),)
    assert report.ids == ["Test_Tiny"] and report.skipped == ()
