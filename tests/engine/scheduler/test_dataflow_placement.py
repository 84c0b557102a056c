"""Serial segments by placement, and where tensors cross between host and device."""

from fakes import PartialBackend
from netbuild import branchy_network

import flowrt
from flowrt.engine.loader.dataflow_builder import build_dataflow
from flowrt.registry import BackendRegistry
from flowrt.types import TensorInfo
from flowrt.workers.cpu.ref import RefBackend


class _Workload:
    host_inputs = frozenset()


def _zigzag():
    """x -> relu (Dev) -> exp (CpuRef) -> sigmoid (Dev) -> add(relu, sigmoid) (Dev) -> y, and
    relu -> z, a second output."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 3)))
    relu = net.add_layer("Relu", inputs=[x], name="relu")
    exp = net.add_layer("Exp", inputs=[relu], name="exp")
    sigmoid = net.add_layer("Sigmoid", inputs=[exp], name="sigmoid")
    add = net.add_layer("Add", inputs=[relu, sigmoid], name="add")
    net.add_output("y", add)
    net.add_output("z", relu)
    registry = BackendRegistry()
    registry.register("CpuRef", RefBackend)
    registry.register("Dev", lambda: PartialBackend("Dev", {"Relu", "Sigmoid", "Add"}))
    return flowrt.optimize(net, backends=["Dev", "CpuRef"], registry=registry)


def _build(opt, device_backends=frozenset(), **kwargs):
    return build_dataflow(
        opt.graph, lambda layer, info: _Workload(), device_backends=device_backends, **kwargs
    )


def test_an_all_host_network_stays_one_segment():
    opt = flowrt.optimize(branchy_network(), backends=["CpuRef"])
    (segment,) = _build(opt, frozenset({"GpuAcc"})).segments
    assert not segment.device and segment.uploads == () == segment.downloads
    assert segment.depends_on == frozenset()


def test_host_backends_share_a_segment_when_none_is_a_device():
    dataflow = _build(_zigzag())
    (segment,) = dataflow.segments
    assert segment.backend == "Dev+CpuRef" and not segment.device


def test_consecutive_workloads_of_one_placement_form_a_segment_each_after_the_last():
    dataflow = _build(_zigzag(), frozenset({"Dev"}))
    segments = dataflow.segments
    assert [[n.layer for n in s.nodes] for s in segments] == [["relu"], ["exp"], ["sigmoid", "add"]]
    assert [s.device for s in segments] == [True, False, True]
    assert [s.depends_on for s in segments] == [frozenset(), {0}, {1}]


def test_crossings_are_marked_once_where_the_other_side_reads():
    dataflow = _build(_zigzag(), frozenset({"Dev"}))
    relu, exp, sigmoid, add = (n.outputs[0] for n in dataflow.order)
    first, host, last = dataflow.segments
    # the feed goes up once; relu's output comes down for exp and as output z, and stays up for add
    assert first.uploads == (dataflow.inputs["x"],) and first.downloads == (relu,)
    assert host.uploads == () == host.downloads
    assert last.uploads == (exp,) and last.downloads == (add,)
    assert sigmoid not in dataflow.downloads and dataflow.downloads == {relu, add}


def test_parallel_branch_segments_are_placed_too():
    dataflow = _build(_zigzag(), frozenset({"Dev"}), parallel_branches=True)
    placed = {n.layer: s for s in dataflow.segments for n in s.nodes}
    assert placed["relu"].device and not placed["exp"].device and placed["add"].device
    assert placed["relu"].downloads == (dataflow.order[0].outputs[0],)
    # add reads relu's output on the device: the segment it runs in comes after relu's
    assert dataflow.order[0].outputs[0] not in placed["add"].uploads


def _two_chains():
    """relu(x) -> sigmoid (Dev) beside exp(m) -> exp (CpuRef), added on Dev; inserted
    alternately, so that the graph's own order interleaves the two chains."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 3)))
    m = net.add_input("m", TensorInfo((2, 3)))
    relu = net.add_layer("Relu", inputs=[x], name="relu")
    exp1 = net.add_layer("Exp", inputs=[m], name="exp1")
    sigmoid = net.add_layer("Sigmoid", inputs=[relu], name="sigmoid")
    exp2 = net.add_layer("Exp", inputs=[exp1], name="exp2")
    net.add_output("y", net.add_layer("Add", inputs=[sigmoid, exp2], name="add"))
    registry = BackendRegistry()
    registry.register("CpuRef", RefBackend)
    registry.register("Dev", lambda: PartialBackend("Dev", {"Relu", "Sigmoid", "Add"}))
    return flowrt.optimize(net, backends=["Dev", "CpuRef"], registry=registry)


def test_independent_chains_on_the_host_and_a_device_form_a_segment_each():
    opt = _two_chains()
    assert [layer.name for layer in opt.graph.topological_order() if layer.backend] == [
        "relu", "exp1", "sigmoid", "exp2", "add"
    ]  # fmt: skip
    dataflow = _build(opt, frozenset({"Dev"}))
    assert [[n.layer for n in s.nodes] for s in dataflow.segments] == [
        ["relu", "sigmoid"],
        ["exp1", "exp2"],
        ["add"],
    ]
    assert [s.device for s in dataflow.segments] == [True, False, True]
    assert [n.layer for n in dataflow.order] == ["relu", "sigmoid", "exp1", "exp2", "add"]
    # On one placement (no device backend) the graph's order stays as it is.
    assert [n.layer for n in _build(opt).order] == ["relu", "exp1", "sigmoid", "exp2", "add"]
