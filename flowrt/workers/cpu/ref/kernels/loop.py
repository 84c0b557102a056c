"""The Loop kernel, as onnxruntime runs it (see ``flowrt.engine.graph.layers.loop``).

Iterations run while fewer than ``M`` have run (no limit when absent) and the condition holds
(true when absent); the body's first output is the condition of the next. The iteration
number and the condition are fed with the rank the body declares for them (0 or 1).
"""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.loop import LoopDescriptor
from flowrt.workers.cpu.ref.kernels import ref_kernel
from flowrt.workers.cpu.ref.kernels.subgraphs import Bodies, empty_output, one_element, runner, stack


@ref_kernel("Loop")
def loop(
    desc: LoopDescriptor,
    m: np.ndarray | None,
    cond: np.ndarray | None,
    *values: np.ndarray,
    bodies: Bodies | None = None,
):
    """(N final carried values, K scan outputs stacked along a new first axis)."""
    run = runner(bodies, "Loop")
    n = desc.num_carried
    carried, outer = list(values[:n]), dict(zip(desc.captures, values[n:]))
    trip = None if m is None else int(one_element(m, "Loop: M"))
    going = True if cond is None else bool(one_element(cond, "Loop: cond"))
    counter_shape = (1,) if desc.body.rank_of(0) == 1 else ()
    condition_shape = (1,) if desc.body.rank_of(1) == 1 else ()
    scans: list[list[np.ndarray]] = [[] for _ in range(desc.num_scans)]
    iteration = 0
    while going and (trip is None or iteration < trip):
        counter = np.full(counter_shape, iteration, dtype=np.int64)
        outputs = run.run(0, [counter, np.full(condition_shape, going), *carried], outer)
        going = bool(one_element(outputs[0], "Loop: the body's condition output"))
        carried = outputs[1 : 1 + n]
        for values_k, value in zip(scans, outputs[1 + n :]):
            values_k.append(value)
        iteration += 1
    stacked = [
        stack(values_k, f"Loop: scan output {k}") if values_k else empty_output(run.empty_outputs[n + k])
        for k, values_k in enumerate(scans)
    ]
    return (*carried, *stacked)
