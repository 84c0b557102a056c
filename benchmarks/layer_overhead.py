"""The engine's own cost per layer: a chain of tiny layers, flowrt against ONNX Runtime.

    python benchmarks/layer_overhead.py [--layers 400] [--width 64] [--iterations 200]

The model is a chain of ``--layers`` layers cycling through Add (of a constant), Relu and Mul
(by a constant) on a ``(1, width)`` float32 tensor: its kernels take tens of nanoseconds, so a
run's time is what each engine spends around them. ONNX Runtime runs it with its graph
optimizations off (they would fold the chain) and one intra-op thread. Each engine is
measured alone: a block of runs of one, a pause, then a block of the other, and the
per-layer figure is the median run's time divided by the number of layers. A chain of one
layer, measured the same way, gives each engine's fixed cost per run, which is taken off.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import trio
from onnx import TensorProto, helper, numpy_helper

import flowrt

PAUSE = 0.5  # seconds between one engine's block and the other's


def chain_model(layers: int, width: int) -> onnx.ModelProto:
    """A chain of ``layers`` Add / Relu / Mul nodes on a ``(1, width)`` tensor."""
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        out = f"t{i}" if i < layers - 1 else "y"
        kind = ("Add", "Relu", "Mul")[i % 3]
        inputs = [prev]
        if kind != "Relu":
            c = f"c{i}"
            value = rng.uniform(0.9, 1.1, (1, width)).astype(np.float32)
            inits.append(numpy_helper.from_array(value, c))
            inputs.append(c)
        nodes.append(helper.make_node(kind, inputs, [out], name=f"n{i}"))
        prev = out
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, width))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, width))],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def time_flowrt(path: Path, feeds: dict, iterations: int, backends: list[str]) -> tuple[float, np.ndarray]:
    """Median seconds per run of the model at ``path`` on flowrt, and its output."""

    async def measure() -> tuple[float, np.ndarray]:
        opt = flowrt.optimize(flowrt.onnx.load(str(path)), backends=backends)
        async with flowrt.Runtime() as rt:
            model = await rt.load(opt)
            for _ in range(max(10, iterations // 10)):
                out = await model.run(feeds)
            times = []
            for _ in range(iterations):
                start = time.perf_counter()
                await model.run(feeds)
                times.append(time.perf_counter() - start)
        return statistics.median(times), out["y"]

    return trio.run(measure)


def time_ort(path: Path, feeds: dict, iterations: int) -> tuple[float, np.ndarray]:
    """Median seconds per run on ONNX Runtime, graph optimizations off, one thread."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for _ in range(max(10, iterations // 10)):
        (out,) = session.run(None, feeds)
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=400)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--backends", default="CpuAcc,CpuRef")
    args = parser.parse_args()
    backends = args.backends.split(",")
    feeds = {"x": np.random.default_rng(1).standard_normal((1, args.width)).astype(np.float32)}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for n in (1, args.layers):
            paths[n] = Path(tmp) / f"chain{n}.onnx"
            onnx.save(chain_model(n, args.width), paths[n])
        ours, theirs = {}, {}
        for n, path in paths.items():
            ours[n], got = time_flowrt(path, feeds, args.iterations, backends)
            time.sleep(PAUSE)
            theirs[n], expected = time_ort(path, feeds, args.iterations)
            time.sleep(PAUSE)
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    per_layer = (ours[args.layers] - ours[1]) / (args.layers - 1) * 1e6
    per_node = (theirs[args.layers] - theirs[1]) / (args.layers - 1) * 1e6
    print(
        f"chain of {args.layers} Add/Relu/Mul layers on (1, {args.width}) float32, backends {args.backends}"
    )
    print("| engine | run of 1 layer µs | run of the chain µs | µs per layer |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| flowrt | {ours[1] * 1e6:.1f} | {ours[args.layers] * 1e6:.1f} | {per_layer:.2f} |")
    print(f"| ONNX Runtime | {theirs[1] * 1e6:.1f} | {theirs[args.layers] * 1e6:.1f} | {per_node:.2f} |")
    print(f"ratio flowrt / ONNX Runtime per layer: {per_layer / per_node:.1f}")


if __name__ == "__main__":
    main()
