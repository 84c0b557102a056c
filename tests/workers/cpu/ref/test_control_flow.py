"""CpuRef's If, Loop and Scan kernels with a stand-in for their bodies (axes, directions,
trip counts), and SubgraphWorkload through the Python builder: bodies built as Networks,
captured constants, no constant folding of a layer with subgraphs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flowrt
from flowrt.engine.graph.layers.if_else import IfDescriptor
from flowrt.engine.graph.layers.loop import LoopDescriptor
from flowrt.engine.graph.layers.scan import ScanDescriptor
from flowrt.engine.graph.layers.subgraph_body import Body
from flowrt.errors import BackendError
from flowrt.registry import WorkloadInfo
from flowrt.types import DataType, TensorInfo
from flowrt.workers.cpu.ref.kernels import load_all
from flowrt.workers.cpu.ref.workload_factory import RefWorkloadFactory

F32 = TensorInfo((3,))


class StandIn:
    """Runs a Python function as the layer's body, recording each call's formal inputs."""

    def __init__(self, body, empty_outputs=()) -> None:
        self.body = body
        self.empty_outputs = empty_outputs
        self.calls: list[list[np.ndarray]] = []

    def run(self, index, inputs, outer):
        self.calls.append(list(inputs))
        return self.body(index, inputs, outer)


def _body(inputs: list[tuple[str, TensorInfo]], outputs: list[str], captures=()) -> Body:
    """A body of the given inputs whose outputs all read the first: enough for a descriptor."""
    net = flowrt.Network()
    first = [net.add_input(name, info) for name, info in inputs][0]
    for name in outputs:
        net.add_output(name, first)
    return Body.from_network(net, captures)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.data())
def test_scan_slices_and_stacks_along_its_axes_and_directions(dims, data):
    rank = len(dims)
    in_axis, out_axis = (data.draw(st.integers(-rank, rank - 1)) for _ in range(2))
    in_dir, out_dir = (data.draw(st.sampled_from([0, 1])) for _ in range(2))
    x = np.random.default_rng(rank).standard_normal(dims).astype(np.float32)
    body = _body([("s", F32), ("x_t", F32)], ["s_out", "y"])
    desc = ScanDescriptor(
        body,
        scan_input_axes=(in_axis,),
        scan_input_directions=(in_dir,),
        scan_output_axes=(out_axis,),
        scan_output_directions=(out_dir,),
    )
    stand_in = StandIn(lambda i, inputs, outer: [inputs[0] + inputs[1], 2 * (inputs[0] + inputs[1])])
    s0 = np.zeros(np.delete(np.array(dims), in_axis % rank), np.float32)
    state, stacked = load_all()["Scan"](desc, s0, x, bodies=stand_in)
    # The same, written as cumulative sums of the sequence in reading order.
    sequence = np.moveaxis(x, in_axis, 0)[:: -1 if in_dir else 1]
    sums = np.cumsum(sequence, axis=0, dtype=np.float32)
    np.testing.assert_allclose(state, sums[-1], rtol=1e-5)
    np.testing.assert_allclose(
        stacked, np.moveaxis(2 * sums[:: -1 if out_dir else 1], 0, out_axis), rtol=1e-5
    )
    assert stacked.flags.c_contiguous and len(stand_in.calls) == dims[in_axis]


@pytest.mark.parametrize(
    ("trips", "cond", "stop", "iterations"),
    [
        (5, True, 10, 5),
        (5, True, 3, 3),
        (None, True, 4, 4),
        (None, None, 2, 2),
        (5, False, 10, 0),
        (-1, True, 9, 0),
    ],
)
def test_loop_runs_while_the_trip_count_and_the_condition_allow(trips, cond, stop, iterations):
    body = _body(
        [("i", TensorInfo((), DataType.INT64)), ("c", TensorInfo((), DataType.BOOL)), ("v", F32)],
        ["c2", "v2", "i2"],
    )
    desc = LoopDescriptor(body)
    stand_in = StandIn(
        lambda _, inputs, outer: [inputs[0] + 1 < stop, inputs[2] + 1, inputs[0]],
        empty_outputs=(F32, TensorInfo((0, 7), DataType.INT64)),
    )
    m = None if trips is None else np.array(trips, np.int64)
    c = None if cond is None else np.array(cond)
    v, counters = load_all()["Loop"](desc, m, c, np.zeros(3, np.float32), bodies=stand_in)
    np.testing.assert_array_equal(v, np.full(3, iterations, np.float32))
    if iterations:
        np.testing.assert_array_equal(counters, np.arange(iterations))
        assert stand_in.calls[0][1].shape == () and stand_in.calls[0][1].dtype == bool
    else:
        assert counters.shape == (0, 7) and counters.dtype == np.int64


def test_if_picks_the_branch_by_its_one_element_condition():
    branch = _body([("x", F32)], ["y"], captures=["x"])
    desc = IfDescriptor(branch, branch, captures=("x",))
    stand_in = StandIn(lambda index, inputs, outer: [outer["x"] + index])
    x = np.zeros(3, np.float32)
    (then,) = load_all()["If"](desc, np.array([True]), x, bodies=stand_in)
    (other,) = load_all()["If"](desc, np.array(False), x, bodies=stand_in)
    assert then[0] == 0 and other[0] == 1
    with pytest.raises(flowrt.errors.ShapeError, match=r"If: cond must hold one element, got shape \(2,\)"):
        load_all()["If"](desc, np.array([True, False]), x, bodies=stand_in)


def test_kernel_and_workload_outside_a_load_say_how_they_run():
    branch = _body([("x", F32)], ["y"], captures=["x"])
    desc = IfDescriptor(branch, branch, captures=("x",), num_outputs=1)
    with pytest.raises(BackendError, match="runs its subgraphs through a loaded workload"):
        load_all()["If"](desc, np.array(True), np.zeros(3, np.float32))
    info = WorkloadInfo("pick", "If", desc, (TensorInfo((), DataType.BOOL), F32), (F32,))
    with pytest.raises(BackendError, match="layer 'pick' \\(If\\) runs its subgraphs as nested dataflows"):
        RefWorkloadFactory().create_workload(info).execute([np.array(True), np.zeros(3, np.float32)])


def _power_loop(net: flowrt.Network, v0, x) -> flowrt.engine.graph.graph.Layer:
    """v *= x for M = 3 iterations (x captured from the outer network), scanning each v."""
    body = flowrt.Network()
    body.add_input("i", TensorInfo((), DataType.INT64))
    going = body.add_input("c", TensorInfo((), DataType.BOOL))
    v = body.add_input("v", F32)
    product = body.add_layer("Mul", inputs=[v, body.add_input("x", F32)])
    body.add_output("c_out", going)
    body.add_output("v_out", product)
    body.add_output("scan", product)
    desc = LoopDescriptor(Body.from_network(body, captures=["x"]), captures=("x",))
    m, cond = np.array(3, np.int64), np.array(True)
    return net.add_layer("Loop", desc, [m, cond, v0, x], name="power", num_outputs=2)


def test_python_built_loop_runs_its_body_with_a_captured_constant():
    net = flowrt.Network()
    v0 = net.add_input("v0", F32)
    loop = _power_loop(net, v0, np.array([2, 3, -1], np.float32))
    net.add_output("v", loop.outputs[0])
    net.add_output("powers", loop.outputs[1])
    with flowrt.InferenceSession(net, backends=["CpuRef"]) as session:
        v, powers = session.run(None, {"v0": np.ones(3, np.float32)})
        workload = RefWorkloadFactory().create_workload(
            flowrt.engine.graph.graph.workload_info(session.optimized.graph.layers["power"])
        )
    np.testing.assert_array_equal(v, [8, 27, -1])
    np.testing.assert_array_equal(powers, [[2, 3, -1], [4, 9, 1], [8, 27, -1]])
    # The captured constant is folded into the body at load: it is no input of the body any more.
    workload.prepare()
    assert [layer.descriptor.name for layer in workload.subgraphs[0].input_layers] == ["i", "c", "v"]


def test_loop_of_constants_is_not_folded_and_runs_with_the_network():
    net = flowrt.Network()
    x = net.add_input("x", F32)
    loop = _power_loop(net, np.ones(3, np.float32), np.array([2, 3, -1], np.float32))
    net.add_output("y", net.add_layer("Add", inputs=[loop.outputs[0], x]))
    with flowrt.InferenceSession(net, backends=["CpuRef"]) as session:
        assert "power" in session.optimized.graph.layers
        (y,) = session.run(None, {"x": np.zeros(3, np.float32)})
    np.testing.assert_array_equal(y, [8, 27, -1])
