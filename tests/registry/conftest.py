"""Fixtures of the registry tests: dynamic backend discovery isolated from the machine's."""

from __future__ import annotations

from pathlib import Path

import pytest
from dynbackends import trusted_tmp_path_fixture  # noqa: F401  (the trusted_tmp_path fixture)

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


@pytest.fixture
def tmp_path(trusted_tmp_path: Path) -> Path:
    """Backend files must lie where flowrt trusts them: not below /tmp, as pytest's own would."""
    return trusted_tmp_path
