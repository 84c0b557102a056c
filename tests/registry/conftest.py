"""Fixtures of the registry tests: dynamic backend discovery isolated from the machine's."""

from __future__ import annotations

import pytest

import flowrt
import flowrt.registry
import flowrt.registry.dynamic as dynamic
from flowrt.registry import backend_registry


@pytest.fixture(autouse=True)
def isolated_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    """No installed distribution's entry points and no FLOWRT_BACKEND_PATHS from the environment."""
    monkeypatch.setattr(dynamic, "advertised_entry_points", lambda: [])
    monkeypatch.delenv(dynamic.BACKEND_PATHS_ENV, raising=False)


@pytest.fixture
def registry() -> flowrt.BackendRegistry:
    return backend_registry().copy()
