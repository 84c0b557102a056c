"""``import flowrt`` is light and changes nothing process-wide: numba, onnx, trio and the BLAS
tools load when first needed, and numba's threading layer and libgomp's spin are chosen then,
before numba starts a layer (``flowrt.workers.cpu.threading_layer``); every public name still
resolves. Timing is ``benchmarks/import_time.py``'s job, not a test's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import flowrt

# Each costs tens of milliseconds or more to import (trio alone about 0.1 s, most of what
# ``import onnxruntime`` costs in all), and none is needed to build or optimize a network.
HEAVY = ("numba", "llvmlite", "scipy", "threadpoolctl", "onnx", "pyopencl", "trio")

_IMPORT_ONLY = """
import json, os, sys
before = dict(os.environ)
import flowrt
print(json.dumps({
    "changed": sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)),
    "heavy": [m for m in sys.argv[1:] if m in sys.modules],
}))
"""

# A parallel region (a Relu that CpuAcc splits across two workers) after flowrt chose.
_FIRST_CPUACC_USE = """
import json, os, sys
import numpy as np, flowrt
net = flowrt.Network()
x = net.add_input("x", flowrt.TensorInfo((1, 64, 128, 128), flowrt.DataType.FLOAT32))
net.add_output("y", net.add_layer("Relu", inputs=[x]))
opt = flowrt.optimize(net, backends=["CpuAcc"])
import numba
from flowrt.workers.cpu import threading_layer
optimized = {"numba": "numba" in sys.modules, "layer": threading_layer.current(),
             "spin": os.environ.get("GOMP_SPINCOUNT")}
with flowrt.InferenceSession(opt, cpu_workers=2) as session:
    (y,) = session.run(None, {"x": -np.ones((1, 64, 128, 128), np.float32)})
print(json.dumps({"optimized": optimized, "asked": threading_layer.requested(),
                  "configured": str(numba.config.THREADING_LAYER), "max": float(y.max())}))
"""

# A runtime entered and a model run under trio: asyncio is the asyncio bridge's alone.
_UNDER_TRIO = """
import json, sys
import numpy as np, trio, flowrt
async def main():
    net = flowrt.Network()
    x = net.add_input("x", flowrt.TensorInfo((1, 4), flowrt.DataType.FLOAT32))
    net.add_output("y", net.add_layer("Relu", inputs=[x]))
    async with flowrt.Runtime() as rt:
        model = await rt.load(flowrt.optimize(net, backends=["CpuRef"]))
        out = await model.run({"x": -np.ones((1, 4), np.float32)})
    return float(out["y"].max())
print(json.dumps({"max": trio.run(main), "asyncio": "asyncio" in sys.modules}))
"""

_WRONG_MODEL = """
import json, sys
import flowrt
try:
    flowrt.InferenceSession(42)
except Exception as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e), "onnx": "onnx" in sys.modules}))
"""


def _child_env() -> dict[str, str]:
    """This environment without the variables flowrt may set or read at first use, so that a
    change would show."""
    drop = {"GOMP_SPINCOUNT", "NUMBA_THREADING_LAYER", "PYTHONDONTWRITEBYTECODE"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def _run(code: str, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=_child_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_flowrt_changes_no_environment_and_loads_no_heavy_package():
    report = _run(_IMPORT_ONLY, *HEAVY)
    assert report["changed"] == [], f"import flowrt changed the environment: {report['changed']}"
    assert report["heavy"] == [], f"import flowrt imported {report['heavy']}"


def test_first_cpuacc_use_chooses_numbas_threading_layer_before_numba_starts_one():
    report = _run(_FIRST_CPUACC_USE)
    # Optimizing for CpuAcc loads its kernels, and numba with them, but starts no layer...
    assert report["optimized"] == {"numba": True, "layer": None, "spin": "30000"}
    # ...so the layer it then starts is the one flowrt asked for.
    assert report["configured"] == report["asked"]
    assert report["max"] == 0.0


def test_a_runtime_under_trio_does_not_import_asyncio():
    report = _run(_UNDER_TRIO)
    assert report == {"max": 0.0, "asyncio": False}


def test_every_public_name_resolves_and_is_listed():
    for name in flowrt.__all__:
        assert getattr(flowrt, name) is not None, name
    assert set(flowrt.__all__) <= set(dir(flowrt))
    from flowrt import InferenceSession, Pipeline, Runtime, SessionOptions

    assert InferenceSession.__module__ == "flowrt.session"
    assert (Pipeline, Runtime, SessionOptions) == (flowrt.Pipeline, flowrt.Runtime, flowrt.SessionOptions)


def test_an_unknown_attribute_of_flowrt_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchThing'"):
        flowrt.NoSuchThing  # noqa: B018


def test_a_session_on_a_wrong_model_type_is_an_argument_error_before_onnx_is_imported():
    report = _run(_WRONG_MODEL)
    assert report["error"] == "ArgumentError" and "path_or_bytes" in report["message"]
    assert report["onnx"] is False


def test_stream_closed_error_is_one_class_and_still_trios_closed_resource_error():
    import pickle

    import trio

    from flowrt.errors import StreamClosedError

    assert StreamClosedError is flowrt.errors.StreamClosedError
    assert issubclass(StreamClosedError, flowrt.errors.FlowrtError)
    assert issubclass(StreamClosedError, trio.ClosedResourceError)
    error = pickle.loads(pickle.dumps(StreamClosedError("stream 'x' is closed")))
    assert type(error) is StreamClosedError and "closed" in str(error)
