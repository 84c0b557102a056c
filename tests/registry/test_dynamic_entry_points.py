"""Dynamic backends from the ``flowrt.backends`` entry points; a runtime registers what it
loads until it closes; a scan registers nothing."""

from __future__ import annotations

import types

import attrs
import pytest
from dynbackends import EXAMPLES, assert_runs, backend_source, warnings_about, write_backend

import flowrt
import flowrt.registry
import flowrt.registry.dynamic as dynamic
from flowrt.registry import backend_registry
from flowrt.registry.dynamic import (
    DynamicBackendReport,
    check_backend_version,
    format_report,
    scan_dynamic_backends,
)

REAL_ENTRY_POINT_LOOKUP = dynamic.advertised_entry_points  # before the autouse fixture stubs it


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
