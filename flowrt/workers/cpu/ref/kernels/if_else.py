"""The If kernel: runs the branch its condition chooses (see ``flowrt.engine.graph.layers.if_else``)."""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.if_else import IfDescriptor
from flowrt.workers.cpu.ref.kernels import ref_kernel
from flowrt.workers.cpu.ref.kernels.subgraphs import Bodies, one_element, runner


@ref_kernel("If")
def if_else(desc: IfDescriptor, cond: np.ndarray, *captured: np.ndarray, bodies: Bodies | None = None):
    """The outputs of then_branch when ``cond`` (one element) is true, else of else_branch."""
    run = runner(bodies, "If").run
    branch = 0 if bool(one_element(cond, "If: cond")) else 1
    return tuple(run(branch, [], dict(zip(desc.captures, captured))))
