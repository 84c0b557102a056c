import pytest
from fakes import PartialBackend

import flowrt
from flowrt.errors import BackendError
from flowrt.registry import BackendId, BackendRegistry, backend_registry


def test_cpuref_is_registered_by_default():
    assert "CpuRef" in backend_registry().ids()
    backend = backend_registry().get("CpuRef")
    assert backend.id == "CpuRef"
    assert backend.version == (1, 0)


def test_register_get_unregister_round_trip():
    registry = BackendRegistry()
    registry.register("Fake", lambda: PartialBackend("Fake", {"Relu"}))
    assert registry.is_registered("Fake")
    assert registry.ids() == [BackendId("Fake")]
    assert registry.get("Fake").kinds == {"Relu"}
    registry.unregister("Fake")
    assert not registry.is_registered("Fake")


def test_registry_makes_a_fresh_backend_each_time():
    registry = BackendRegistry()
    registry.register("Fake", lambda: PartialBackend("Fake", set()))
    assert registry.get("Fake") is not registry.get("Fake")


def test_duplicate_registration_is_refused():
    registry = BackendRegistry()
    registry.register("Fake", lambda: PartialBackend("Fake", set()))
    with pytest.raises(BackendError, match="already registered"):
        registry.register("Fake", lambda: PartialBackend("Fake", set()))


def test_unknown_backend_error_lists_registered_ones():
    with pytest.raises(BackendError, match=r"'Nope' is not registered.*CpuRef"):
        backend_registry().get("Nope")


def test_failing_factory_becomes_backend_error():
    registry = BackendRegistry()

    def broken():
        raise RuntimeError("no device")

    registry.register("Broken", broken)
    with pytest.raises(BackendError, match="Broken.*no device"):
        registry.get("Broken")


def test_optimize_with_unknown_backend_names_it():
    net = flowrt.Network()
    with pytest.raises(BackendError, match="'Missing' is not registered"):
        flowrt.optimize(net, backends=["Missing"])
