"""An optimized network run through the public API, as the fusion tests run theirs: a
request at a time, and the same requests through a batching stream."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import trio

import flowrt


def lone_runs(opt: flowrt.OptimizedNetwork, feeds: Sequence[dict], output: str = "out") -> list[np.ndarray]:
    """``output`` of one run per feed dict, in a pool of its own."""

    async def main():
        async with flowrt.Runtime(cpu_workers=1) as rt:
            loaded = await rt.load(opt, max_in_flight=1)
            return [(await loaded.run(f))[output] for f in feeds]

    return trio.run(main)


def steady_launches(
    opt: flowrt.OptimizedNetwork, feeds: dict, output: str = "out"
) -> tuple[dict[str, int], np.ndarray]:
    """Kernel launches by layer of a profiled run after the one that records them (the
    pool's second), and its ``output``."""

    async def main():
        async with flowrt.Runtime(cpu_workers=1) as rt:
            model = await rt.load(opt, max_in_flight=1)
            for _ in range(2):
                await model.run(feeds)
            out = (await model.run(feeds, profile=True))[output]
            return {r.layer: r.launches for r in model.profile()}, out

    return trio.run(main)


def cpuref_output(net: flowrt.Network, feeds: dict, output: str = "out") -> np.ndarray:
    """``output`` of ``net`` run on CpuRef alone."""
    return lone_runs(flowrt.optimize(net, backends=["CpuRef"]), [feeds], output)[0]


def alone_and_batched(
    opt: flowrt.OptimizedNetwork, feeds: Sequence[dict], output: str = "out"
) -> tuple[list[np.ndarray], list[np.ndarray], dict[int, int]]:
    """(``output`` of each feed run alone, of each sent at once through a stream batching up
    to all of them, the stream's batch counts)."""

    async def main():
        async with flowrt.Runtime(cpu_workers=1) as rt:
            loaded = await rt.load(opt)
            alone = [(await loaded.run(f))[output] for f in feeds]
            got: list = [None] * len(feeds)
            async with loaded.stream(max_batch=len(feeds), max_delay=0.5) as stream:
                async with trio.open_nursery() as nursery:
                    for i, f in enumerate(feeds):

                        async def one(i=i, f=f):
                            got[i] = (await stream.submit(f))[output]

                        nursery.start_soon(one)
            return alone, got, stream.batch_counts

    return trio.run(main)


def sequence_model(nodes: list, inits: dict[str, np.ndarray], seq: int, width: int, name: str) -> bytes:
    """An ONNX model (opset 17) of ``nodes`` from a float input ``x`` of (1, seq, width) to an
    output ``out`` of the same shape, ``inits`` its initializers."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, width])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, seq, width])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
