"""Model repositories for the ``flowrt serve`` tests: random-weight convs, and their
CpuRef outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import flowrt
from flowrt import serialize
from flowrt.types import TensorInfo


def _net(size: int = 16, channels: int = 8) -> flowrt.Network:
    """Random-weight convs: batch 1, input x (1, 3, size, size), output y."""
    rng = np.random.default_rng(0)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 3, size, size)))
    pad = flowrt.descriptors.Conv(pads=(1, 1, 1, 1))
    a = net.add_layer("Conv", pad, [x, w(channels, 3, 3, 3), w(channels)], name="a")
    b = net.add_layer("Relu", inputs=[a], name="b")
    c = net.add_layer("Conv", pad, [b, w(channels, channels, 3, 3), w(channels)], name="c")
    net.add_output("y", net.add_layer("GlobalAveragePool", inputs=[c], name="d"))
    return net


def _repository(root: Path, models: dict[str, str | None], net: flowrt.Network | None = None) -> Path:
    """A repository of ``models`` (name -> config.pbtxt text or None), each the same network."""
    opt = flowrt.optimize(net or _net(), backends=["CpuAcc", "CpuRef"])
    for name, config in models.items():
        (root / name / "1").mkdir(parents=True)
        serialize.save(opt, root / name / "1" / "model.flowrt")
        if config is not None:
            (root / name / "config.pbtxt").write_text(config)
    return root


async def _reference(x: np.ndarray, net: flowrt.Network | None = None) -> np.ndarray:
    async with flowrt.Runtime() as rt:
        model = await rt.load(flowrt.optimize(net or _net(), backends=["CpuRef"]))
        return np.concatenate([(await model.run({"x": row[None]}))["y"] for row in x])


def _input(rows: int = 1, seed: int = 1, size: int = 16) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 3, size, size)).astype(np.float32)
