"""Backend files, networks and checks shared by the dynamic backend tests."""

from __future__ import annotations

import logging
import shutil
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import flowrt
import flowrt.registry
import flowrt.registry.dynamic as dynamic
from flowrt.trusted_paths import untrusted_reason

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "backends"


@pytest.fixture(name="trusted_tmp_path")
def trusted_tmp_path_fixture() -> Iterator[Path]:
    """A fresh empty directory that flowrt trusts for backend code (pytest's tmp_path lies below
    the world-writable /tmp, which it does not): under ~/.cache, removed afterwards."""
    root = Path.home() / ".cache" / "flowrt-tests"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(dir=root))
    problem = untrusted_reason(directory)
    if problem:
        shutil.rmtree(directory, ignore_errors=True)
        pytest.skip(f"no trusted directory for backend files: {problem}")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


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
