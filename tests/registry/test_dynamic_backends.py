"""Dynamic backends: Arm NN's DynamicBackend rules (naming, version, paths, skipping) in Python."""

from __future__ import annotations

import logging
import os
import textwrap
import types
from pathlib import Path

import attrs
import numpy as np
import pytest

import flowrt
import flowrt.models
import flowrt.registry
import flowrt.registry.dynamic as dynamic
from flowrt.registry import backend_registry
from flowrt.registry.dynamic import (
    DynamicBackendReport,
    LoadedBackend,
    SkippedBackend,
    check_backend_version,
    format_report,
    load_dynamic_backends,
    scan_dynamic_backends,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "backends"
REAL_ENTRY_POINT_LOOKUP = dynamic.advertised_entry_points  # before the autouse fixture stubs it


def backend_source(backend_id: str = "Test_Tiny", version: object = (1, 0), factory: str = "") -> str:
    """A backend file that runs Relu with CpuRef's kernel (through tests/fakes.py)."""
    factory = factory or "PartialBackend(BACKEND_ID, {'Relu'})"
    return textwrap.dedent(f"""\
        from fakes import PartialBackend

        BACKEND_ID = {backend_id!r}

        def get_backend_id():
            return BACKEND_ID

        def get_version():
            return {version!r}

        def backend_factory():
            return {factory}
        """)


def write_backend(directory: Path, name: str = "Test_Tiny_backend.py", source: str | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(backend_source() if source is None else source)
    return path


def tiny_network() -> flowrt.Network:
    net = flowrt.Network()
    x = net.add_input("x", flowrt.TensorInfo((2,)))
    net.add_output("y", net.add_layer("Relu", inputs=[x]))
    return net


async def assert_runs(rt: flowrt.Runtime, backends: tuple[str, ...] = ("CpuRef",)) -> None:
    """The runtime still loads and runs a model."""
    opt = flowrt.optimize(tiny_network(), backends=list(backends), registry=rt.registry)
    outputs = await (await rt.load(opt)).run({"x": np.array([-1.0, 2.0], np.float32)})
    np.testing.assert_array_equal(outputs["y"], [0.0, 2.0])


def warnings_about(caplog: pytest.LogCaptureFixture, source: object) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == dynamic.__name__ and str(source) in r.getMessage()
    ]


@pytest.fixture(autouse=True)
def isolated_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    """No installed distribution's entry points and no FLOWRT_BACKEND_PATHS from the environment."""
    monkeypatch.setattr(dynamic, "advertised_entry_points", lambda: [])
    monkeypatch.delenv(dynamic.BACKEND_PATHS_ENV, raising=False)


@pytest.fixture
def registry() -> flowrt.BackendRegistry:
    return backend_registry().copy()


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


# -- entry points --------------------------------------------------------------------------------
@attrs.frozen
class FakeEntryPoint:
    """What importlib.metadata.EntryPoint offers the loader: name, value, load()."""

    name: str
    value: str
    target: object = None
    error: Exception | None = None

    def load(self) -> object:
        if self.error is not None:
            raise self.error
        return self.target


def provider_module(backend_id: str, version: object = (1, 0)) -> types.ModuleType:
    module = types.ModuleType(f"acme_{backend_id.lower()}")
    exec(backend_source(backend_id, version), module.__dict__)
    return module


async def test_entry_point_backends_are_loaded(tmp_path, registry, caplog, monkeypatch):
    as_object = types.SimpleNamespace(
        **{n: getattr(provider_module("Ep_Object"), n) for n in dynamic._REQUIRED_FUNCTIONS}
    )
    entry_points = [
        FakeEntryPoint("module", "acme.module", provider_module("Ep_Module")),
        FakeEntryPoint("object", "acme.module:provider", as_object),
        FakeEntryPoint("broken", "acme.broken", error=ImportError("No module named 'acme.broken'")),
        FakeEntryPoint("old", "acme.old", provider_module("Ep_Old", (0, 3))),
        FakeEntryPoint("same", "acme.same", provider_module("Test_Tiny")),
    ]
    monkeypatch.setattr(dynamic, "advertised_entry_points", lambda: entry_points)
    backend_file = write_backend(tmp_path)
    async with flowrt.Runtime(registry, backend_paths=[tmp_path]) as rt:
        report = rt.dynamic_backends
        assert report.found == (
            str(backend_file),
            *(f"entry point {e.name} = {e.value}" for e in entry_points),
        )
        assert report.ids == ["Test_Tiny", "Ep_Module", "Ep_Object"]
        skipped = {s.source: s.reason for s in report.skipped}
        assert skipped == {
            "entry point broken = acme.broken": "loading it raised ImportError: No module named 'acme.broken'",
            "entry point old = acme.old": check_backend_version_error((0, 3)),
            "entry point same = acme.same": f"backend id 'Test_Tiny' was already loaded from {backend_file}",
        }
        for source, reason in skipped.items():
            assert warnings_about(caplog, source) == [f"skipping dynamic backend {source}: {reason}"]
        for backend in ("Ep_Module", "Ep_Object", "CpuRef"):
            await assert_runs(rt, (backend,))
    assert registry.ids() == backend_registry().ids()


def check_backend_version_error(version: object) -> str:
    with pytest.raises(ValueError) as error:
        check_backend_version(version)
    return str(error.value)


async def test_failing_entry_point_listing_does_not_stop_the_runtime(registry, caplog, monkeypatch):
    def broken() -> list:
        raise OSError("unreadable site-packages")

    monkeypatch.setattr(dynamic, "advertised_entry_points", broken)
    async with flowrt.Runtime(registry, backend_paths=[]) as rt:
        assert rt.dynamic_backends.skipped[0].reason == "listing it raised OSError: unreadable site-packages"
        assert warnings_about(caplog, "'flowrt.backends'")
        await assert_runs(rt)


def test_entry_points_are_read_from_the_flowrt_backends_group(monkeypatch):
    asked = []
    monkeypatch.setattr(dynamic.importlib.metadata, "entry_points", lambda **kw: asked.append(kw) or [])
    assert REAL_ENTRY_POINT_LOOKUP() == []
    assert asked == [{"group": "flowrt.backends"}]


# -- runtime lifetime --------------------------------------------------------------------------
async def test_runtime_registers_in_the_default_registry_until_it_closes():
    default = backend_registry()
    try:
        rt = flowrt.Runtime(backend_paths=[EXAMPLES])
        assert default.is_registered("Acme_Sample")
        async with rt:
            await assert_runs(rt, ("Acme_Sample",))
        assert not default.is_registered("Acme_Sample")
        assert rt.dynamic_backends.ids == ["Acme_Sample"]  # the report outlives the registration
        await rt.__aexit__(None, None, None)  # closing twice unregisters nothing more
    finally:
        if default.is_registered("Acme_Sample"):
            default.unregister("Acme_Sample")


async def test_runtime_unregisters_only_what_it_registered(registry, caplog):
    async with flowrt.Runtime(registry, backend_paths=[EXAMPLES]) as first:
        async with flowrt.Runtime(registry, backend_paths=[EXAMPLES]) as second:
            assert second.dynamic_backends.ids == []
            assert "already registered" in second.dynamic_backends.skipped[0].reason
        assert registry.is_registered("Acme_Sample")
        await assert_runs(first, ("Acme_Sample",))
    assert not registry.is_registered("Acme_Sample")


def test_runtime_with_a_bad_argument_registers_nothing(registry):
    with pytest.raises(flowrt.errors.FlowrtError, match="cpu_workers"):
        flowrt.Runtime(registry, cpu_workers=-1, backend_paths=[EXAMPLES])
    assert not registry.is_registered("Acme_Sample")


def test_scan_registers_nothing_and_formats_a_report(tmp_path, registry):
    good = write_backend(tmp_path)
    bad = write_backend(tmp_path, "Bad_Case_backend.py", "raise ImportError('no numpy')")
    report = scan_dynamic_backends([tmp_path, tmp_path / "missing"], registry)
    assert not registry.is_registered("Test_Tiny")
    assert format_report(report) == "\n".join(
        [
            f"backend paths: {tmp_path}",
            "found 2:",
            f"  {bad}",
            f"  {good}",
            "loaded 1:",
            f"  Test_Tiny 1.0  {good}",
            "skipped 2:",
            f"  {tmp_path / 'missing'}: the path does not exist",
            f"  {bad}: import raised ImportError: no numpy",
        ]
    )
    assert format_report(DynamicBackendReport()).splitlines()[0] == "backend paths: none"


# -- the example third-party backend -------------------------------------------------------------
def small_network() -> flowrt.Network:
    """Conv, Relu and Add (Acme_Sample's) around a grouped Conv, MaxPool and Softmax (not its)."""
    rng = np.random.default_rng(7)

    def weights(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.3

    d = flowrt.descriptors
    net = flowrt.Network()
    x = net.add_input("x", flowrt.TensorInfo((1, 3, 12, 12)))
    conv = net.add_layer("Conv", d.Conv(pads=(1, 1, 1, 1)), [x, weights(8, 3, 3, 3), weights(8)], name="conv")
    relu = net.add_layer("Relu", inputs=[conv], name="relu")
    grouped = net.add_layer("Conv", d.Conv(group=2), [relu, weights(8, 4, 1, 1)], name="grouped")
    strided = net.add_layer("Conv", d.Conv(strides=(2, 2)), [relu, weights(8, 8, 2, 2)], name="strided")
    pooled = net.add_layer("MaxPool", d.MaxPool(kernel_shape=(2, 2), strides=(2, 2)), [grouped], name="pool")
    added = net.add_layer("Add", inputs=[strided, pooled], name="add")
    net.add_output("y", net.add_layer("Softmax", d.Softmax(axis=1), [added], name="softmax"))
    return net


async def run_both(net: flowrt.Network, feeds: dict, registry) -> tuple[flowrt.OptimizedNetwork, dict, dict]:
    async with flowrt.Runtime(registry, backend_paths=[EXAMPLES]) as rt:
        assert rt.dynamic_backends.loaded == (
            LoadedBackend("Acme_Sample", (1, 0), str(EXAMPLES / "Acme_Sample_backend.py")),
        )
        opt = flowrt.optimize(net, backends=["Acme_Sample", "CpuRef"], registry=registry)
        split = await (await rt.load(opt)).run(feeds)
        ref = await (await rt.load(flowrt.optimize(net, backends=["CpuRef"], registry=registry))).run(feeds)
    return opt, split, ref


async def test_acme_sample_shares_a_network_with_cpuref(registry):
    x = np.random.default_rng(0).standard_normal((1, 3, 12, 12)).astype(np.float32)
    opt, split, ref = await run_both(small_network(), {"x": x}, registry)
    assert opt.assignments() == {
        "conv": "Acme_Sample",
        "grouped": "CpuRef",
        "strided": "Acme_Sample",
        "pool": "CpuRef",
        "add": "Acme_Sample",
        "softmax": "CpuRef",
    }
    assert opt.decisions["grouped"].declined == {
        "Acme_Sample": "Acme_Sample runs group 1 convolutions only, got group 2"
    }
    assert opt.decisions["pool"].declined["Acme_Sample"].startswith("Acme_Sample has no kernel for MaxPool")
    assert [s.describe() for s in opt.substitutions] == [
        "Acme_Sample: Conv 'conv' + Relu 'relu' -> Conv 'conv' (+Relu)"
    ]
    assert opt.graph.layers["conv"].activation.kind == "Relu"
    np.testing.assert_allclose(split["y"], ref["y"], rtol=1e-4)


async def test_acme_sample_runs_squeezenet_with_cpuref(registry):
    net = flowrt.onnx.load(flowrt.models.light_model("squeezenet"))
    feeds = {name: flowrt.models.pattern_input(info) for name, info in net_inputs(net).items()}
    opt, split, ref = await run_both(net, feeds, registry)
    kinds = {layer.name: layer.kind for layer in opt.graph}
    by_backend: dict[str, set[str]] = {}
    for layer, backend in opt.assignments().items():
        by_backend.setdefault(backend, set()).add(kinds[layer])
    assert by_backend == {
        "Acme_Sample": {"Conv"},  # every Relu follows a Conv, fused into it by optimize_subgraph
        "CpuRef": {"MaxPool", "Concat", "GlobalAveragePool", "Softmax"},
    }
    for name in ref:
        np.testing.assert_allclose(split[name], ref[name], rtol=1e-4)


def net_inputs(net: flowrt.Network) -> dict[str, flowrt.TensorInfo]:
    return {layer.descriptor.name: layer.descriptor.info for layer in net.graph.input_layers}
