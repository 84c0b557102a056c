"""Models that ship with the install, and the deterministic input pattern.

The default model is the light shufflenet that the onnx package ships (with its expected
output) under ``onnx/backend/test/data/light/``. (Not squeezenet: its constant weights give a
uniform softmax over logits near 1e10, which a GEMM that rounds its output channels apart,
as OpenBLAS does on some CPUs, cannot reproduce; see ``flowrt.cli.run``.)
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

import numpy as np

from flowrt.types import DataType, TensorInfo

LIGHT_MODELS = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)


def light_model_dir() -> Path:
    import onnx

    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def light_model(name: str) -> Path:
    """Path of one of onnx's light models, e.g. ``light_model("squeezenet")``."""
    return light_model_dir() / f"light_{name}.onnx"


def default_model() -> Path:
    """The model ``flowrt run`` uses when none is named."""
    return light_model("shufflenet")


def expected_outputs(model_path: str | Path) -> list[np.ndarray]:
    """Outputs shipped beside a model as ``<stem>_output_<i>.pb`` (empty when there are none)."""
    from onnx import TensorProto, numpy_helper

    path = Path(model_path)
    found = []
    for i in range(64):
        pb = path.with_name(f"{path.stem}_output_{i}.pb")
        if not pb.exists():
            break
        tensor = TensorProto()
        tensor.ParseFromString(pb.read_bytes())
        found.append(numpy_helper.to_array(tensor))
    return found


class Tolerance(TypedDict):
    """Keyword arguments of ``np.allclose`` / ``np.testing.assert_allclose``."""

    rtol: float
    atol: float


def expected_tolerance(model_path: str | Path) -> Tolerance:
    """rtol/atol for comparing with a light model's expected output, as onnx's test data gives them."""
    import json

    stem = Path(model_path).stem.removeprefix("light_")
    meta = light_model_dir().parent / "real" / f"test_{stem}" / "data.json"
    if meta.exists():
        data = json.loads(meta.read_text())
        return {"rtol": float(data.get("rtol", 1e-3)), "atol": float(data.get("atol", 1e-7))}
    return {"rtol": 1e-3, "atol": 1e-7}


def pattern_input(info: TensorInfo) -> np.ndarray:
    """The documented deterministic input for ``info``: symbolic or unknown dims become 1;
    floats are ``arange(n).reshape(shape) / n`` (the pattern onnx's backend test feeds its
    light models), integers ``arange(n) % 10``, booleans alternate starting with True.
    """
    shape = tuple(d if isinstance(d, int) else 1 for d in (info.shape or ()))
    n = int(np.prod(shape, dtype=np.int64))
    ramp = np.arange(n).reshape(shape)
    if info.dtype.is_float:
        return (ramp / max(n, 1)).astype(info.dtype.numpy)
    if info.dtype is DataType.BOOL:
        return ramp % 2 == 0
    return (ramp % 10).astype(info.dtype.numpy)
