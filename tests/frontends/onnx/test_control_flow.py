"""ONNX control flow (If, Loop, Scan) imported with its subgraphs and run on CpuRef, against
onnxruntime: outer-scope reads, trip counts and conditions, scan axes and directions, the
fallback from CpuAcc, and the errors a malformed subgraph gets."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import flowrt
from flowrt.errors import DataTypeError, FlowrtError, ModelLoadError, RunError

CONTROL_FLOW = ("If", "Loop", "Scan")


def _model(nodes, inputs, outputs, opset: int = 17) -> onnx.ModelProto:
    graph = h.make_graph(nodes, "g", inputs, outputs)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def _value(name: str, elem: int, shape) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, elem, shape)


@pytest.fixture(scope="module")
def sessions():
    """Make a flowrt session on CpuAcc, CpuRef and an onnxruntime one for a model; the
    flowrt ones are closed at the end of the module."""
    made = []

    def make(model: onnx.ModelProto):
        session = flowrt.InferenceSession(model, backends=["CpuAcc", "CpuRef"])
        made.append(session)
        return session, ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    yield make
    for session in made:
        session.close()


def _assert_same(session, reference, feeds) -> list[np.ndarray]:
    got = session.run(None, feeds)
    expected = reference.run(None, feeds)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-6)
        assert g.shape == e.shape and g.dtype == e.dtype
    return got


def _assert_on_cpuref(session) -> None:
    """Every control-flow layer fell back from CpuAcc to CpuRef, and the report says why."""
    optimized = session.optimized
    layers = {layer.name: layer.kind for layer in optimized.graph}
    placed = {
        name: backend for name, backend in optimized.assignments().items() if layers[name] in CONTROL_FLOW
    }
    assert placed and set(placed.values()) == {"CpuRef"}
    report = optimized.report()
    for name in placed:
        assert f"{name!r} ({layers[name]}) -> CpuRef: CpuAcc: no CpuAcc kernel for {layers[name]}" in report


def _if_model() -> onnx.ModelProto:
    """``y = x + b`` (shape (3,)) when cond, else ``concat(x, b)`` (shape (6,)): both branches
    read the main graph's x and b."""
    then_branch = h.make_graph(
        [h.make_node("Add", ["x", "b"], ["sum"])], "then", [], [_value("sum", T.FLOAT, None)]
    )
    else_branch = h.make_graph(
        [h.make_node("Concat", ["x", "b"], ["both"], axis=0)], "else", [], [_value("both", T.FLOAT, None)]
    )
    node = h.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch)
    inputs = [_value("cond", T.BOOL, []), _value("x", T.FLOAT, [3]), _value("b", T.FLOAT, [3])]
    return _model([node], inputs, [_value("y", T.FLOAT, ["n"])])


def test_if_runs_the_branch_its_condition_picks_reading_outer_values(sessions):
    session, reference = sessions(_if_model())
    _assert_on_cpuref(session)
    x = np.arange(3, dtype=np.float32)
    b = np.array([10, 20, 30], dtype=np.float32)
    taken = _assert_same(session, reference, {"cond": np.array(True), "x": x, "b": b})
    assert taken[0].shape == (3,)
    other = _assert_same(session, reference, {"cond": np.array(False), "x": x, "b": b})
    assert other[0].shape == (6,)
    # The branches disagree on the length: it is unknown until a run.
    assert session.get_outputs()[0].shape == [None]
    layer = next(layer for layer in session.optimized.graph if layer.kind == "If")
    assert layer.descriptor.captures == ("x", "b")


def _loop_body() -> onnx.GraphProto:
    """y += x (x read from the main graph); go on while sum(y) < limit; scan out y."""
    return h.make_graph(
        [
            h.make_node("Add", ["y_in", "x"], ["y_out"]),
            h.make_node("ReduceSum", ["y_out"], ["total"], keepdims=0),
            h.make_node("Less", ["total", "limit"], ["going"]),
            h.make_node("Identity", ["y_out"], ["scan"]),
        ],
        "body",
        [_value("i", T.INT64, []), _value("c", T.BOOL, []), _value("y_in", T.FLOAT, None)],
        [_value("going", T.BOOL, []), _value("y_out", T.FLOAT, None), _value("scan", T.FLOAT, None)],
    )


def test_loop_with_trip_count_condition_and_scan_outputs(sessions):
    node = h.make_node("Loop", ["M", "cond", "y0"], ["y", "ys"], body=_loop_body())
    inputs = [
        _value("M", T.INT64, []),
        _value("cond", T.BOOL, []),
        _value("y0", T.FLOAT, [2]),
        _value("x", T.FLOAT, [2]),
        _value("limit", T.FLOAT, []),
    ]
    session, reference = sessions(
        _model([node], inputs, [_value("y", T.FLOAT, [2]), _value("ys", T.FLOAT, ["n", 2])])
    )
    _assert_on_cpuref(session)
    base = {"y0": np.zeros(2, np.float32), "x": np.array([1, 2], np.float32)}
    for trips, cond, limit, rows in (
        (10, True, 12.0, 4),
        (2, True, 100.0, 2),
        (5, False, 100.0, 0),
        (0, True, 1.0, 0),
    ):
        feeds = {
            **base,
            "M": np.array(trips, np.int64),
            "cond": np.array(cond),
            "limit": np.array(limit, np.float32),
        }
        y, ys = _assert_same(session, reference, feeds)
        assert len(ys) == rows  # with no row, onnxruntime's shape: (0,), the body declares none


def test_loop_trip_count_depends_on_the_data(sessions):
    """No M and no cond: the body's condition alone ends the loop."""
    node = h.make_node("Loop", ["", "", "y0"], ["y", "ys"], body=_loop_body())
    inputs = [_value("y0", T.FLOAT, [2]), _value("x", T.FLOAT, [2]), _value("limit", T.FLOAT, [])]
    session, reference = sessions(
        _model([node], inputs, [_value("y", T.FLOAT, [2]), _value("ys", T.FLOAT, ["n", 2])])
    )
    assert session.get_outputs()[1].shape[0] is None
    for limit in (1.0, 7.0, 30.0):
        feeds = {
            "y0": np.zeros(2, np.float32),
            "x": np.array([0.5, 1], np.float32),
            "limit": np.array(limit, np.float32),
        }
        _assert_same(session, reference, feeds)


def test_loop_carried_value_that_grows_has_unknown_dims(sessions):
    """A carried value that grows each iteration: its dims are not fixed by the first one,
    and a Shape of it in the body is not folded."""
    body = h.make_graph(
        [
            h.make_node("Concat", ["v_in", "one"], ["v_out"], axis=0),
            h.make_node("Shape", ["v_out"], ["shape"]),
            h.make_node("Cast", ["shape"], ["size"], to=T.FLOAT),
        ],
        "body",
        [_value("i", T.INT64, []), _value("c", T.BOOL, []), _value("v_in", T.FLOAT, None)],
        [_value("c", T.BOOL, []), _value("v_out", T.FLOAT, None), _value("size", T.FLOAT, None)],
        initializer=[h.make_tensor("one", T.FLOAT, [1], [1.0])],
    )
    node = h.make_node("Loop", ["M", "", "v0"], ["v", "sizes"], body=body)
    inputs = [_value("M", T.INT64, []), _value("v0", T.FLOAT, [1])]
    session, reference = sessions(
        _model([node], inputs, [_value("v", T.FLOAT, ["k"]), _value("sizes", T.FLOAT, ["n", 1])])
    )
    assert session.get_outputs()[0].shape == [None]
    v, sizes = _assert_same(session, reference, {"M": np.array(3, np.int64), "v0": np.zeros(1, np.float32)})
    np.testing.assert_array_equal(sizes.ravel(), [2, 3, 4])


def test_scan_reverse_directions_and_axes(sessions):
    """A running sum over axis 1 of x, read backwards, stacked along axis 1 last step first;
    a second scan input read forwards along axis 0 of its own."""
    body = h.make_graph(
        [
            h.make_node("Add", ["s_in", "row"], ["s_out"]),
            h.make_node("Mul", ["s_out", "w"], ["weighted"]),
            h.make_node("Add", ["weighted", "k"], ["out"]),
        ],
        "body",
        [_value("s_in", T.FLOAT, [2]), _value("row", T.FLOAT, [2]), _value("k", T.FLOAT, [])],
        [_value("s_out", T.FLOAT, [2]), _value("out", T.FLOAT, [2])],
    )
    node = h.make_node(
        "Scan",
        ["s0", "x", "ks"],
        ["s", "ys"],
        body=body,
        num_scan_inputs=2,
        scan_input_axes=[1, 0],
        scan_input_directions=[1, 0],
        scan_output_axes=[-1],
        scan_output_directions=[1],
    )
    inputs = [
        _value("s0", T.FLOAT, [2]),
        _value("x", T.FLOAT, [2, 4]),
        _value("ks", T.FLOAT, [4]),
        _value("w", T.FLOAT, []),
    ]
    session, reference = sessions(
        _model([node], inputs, [_value("s", T.FLOAT, [2]), _value("ys", T.FLOAT, [2, 4])])
    )
    _assert_on_cpuref(session)
    feeds = {
        "s0": np.array([1, -1], np.float32),
        "x": np.arange(8, dtype=np.float32).reshape(2, 4),
        "ks": np.array([0, 10, 20, 30], np.float32),
        "w": np.array(0.5, np.float32),
    }
    s, ys = _assert_same(session, reference, feeds)
    assert ys.shape == (2, 4)


def test_loop_inside_if_reads_a_main_graph_value(sessions):
    """Nested subgraphs: the Loop's body reads the main graph's x, so the Loop and the If
    that holds it both take x as an input."""
    body = h.make_graph(
        [h.make_node("Mul", ["p_in", "x"], ["p_out"])],
        "body",
        [_value("i", T.INT64, []), _value("c", T.BOOL, []), _value("p_in", T.FLOAT, None)],
        [_value("c", T.BOOL, []), _value("p_out", T.FLOAT, None)],
    )
    then_branch = h.make_graph(
        [h.make_node("Loop", ["n", "", "start"], ["power"], body=body)],
        "then",
        [],
        [_value("power", T.FLOAT, None)],
    )
    else_branch = h.make_graph(
        [h.make_node("Neg", ["x"], ["neg"])], "else", [], [_value("neg", T.FLOAT, None)]
    )
    node = h.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch)
    inputs = [
        _value("cond", T.BOOL, []),
        _value("n", T.INT64, []),
        _value("start", T.FLOAT, [3]),
        _value("x", T.FLOAT, [3]),
    ]
    session, reference = sessions(_model([node], inputs, [_value("y", T.FLOAT, [3])]))
    layer = next(layer for layer in session.optimized.graph if layer.kind == "If")
    assert set(layer.descriptor.captures) == {"n", "start", "x"}
    loop = layer.descriptor.then_branch.graph.of_kind("Loop")[0]
    assert loop.descriptor.captures == ("x",)
    x = np.array([2, 3, -1], np.float32)
    for cond in (True, False):
        feeds = {"cond": np.array(cond), "n": np.array(3, np.int64), "start": np.ones(3, np.float32), "x": x}
        _assert_same(session, reference, feeds)


def test_if_branch_that_cannot_take_the_inputs_fails_only_the_runs_that_take_it():
    """As ONNX's function expansions write (a branch per input rank): the else branch cannot
    reshape 6 values into 4, so the outputs are the then branch's; a run that takes the else
    branch fails, naming the If."""
    then_branch = h.make_graph(
        [h.make_node("Neg", ["x"], ["neg"])], "then", [], [_value("neg", T.FLOAT, None)]
    )
    shape = h.make_tensor("shape", T.INT64, [1], [4])
    else_branch = h.make_graph(
        [h.make_node("Reshape", ["x", "shape"], ["flat"])],
        "else",
        [],
        [_value("flat", T.FLOAT, None)],
        initializer=[shape],
    )
    node = h.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch, name="pick")
    model = _model(
        [node], [_value("cond", T.BOOL, []), _value("x", T.FLOAT, [6])], [_value("y", T.FLOAT, [6])]
    )
    with flowrt.InferenceSession(model, backends=["CpuRef"]) as session:
        assert session.get_outputs()[0].shape == [6]
        x = np.arange(6, dtype=np.float32)
        np.testing.assert_array_equal(session.run(None, {"cond": np.array(True), "x": x})[0], -x)
        with pytest.raises(RunError, match="layer 'pick'.*cannot run on these inputs"):
            session.run(None, {"cond": np.array(False), "x": x})


def test_if_branches_with_different_output_counts_are_refused():
    one = h.make_graph([h.make_node("Neg", ["x"], ["a"])], "one", [], [_value("a", T.FLOAT, None)])
    two = h.make_graph(
        [h.make_node("Neg", ["x"], ["b"]), h.make_node("Abs", ["x"], ["c"])],
        "two",
        [],
        [_value("b", T.FLOAT, None), _value("c", T.FLOAT, None)],
    )
    node = h.make_node("If", ["cond"], ["y"], then_branch=one, else_branch=two, name="pick")
    graph = h.make_graph(
        [node], "g", [_value("cond", T.BOOL, []), _value("x", T.FLOAT, [2])], [_value("y", T.FLOAT, [2])]
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    with pytest.raises(ModelLoadError, match=r"node 'pick': invalid attributes for If: .*else_branch 2"):
        flowrt.onnx.load(model, check=False)


def test_scan_attribute_of_the_wrong_length_is_refused():
    body = h.make_graph(
        [h.make_node("Add", ["s_in", "x_t"], ["s_out"])],
        "body",
        [_value("s_in", T.FLOAT, [2]), _value("x_t", T.FLOAT, [2])],
        [_value("s_out", T.FLOAT, [2])],
    )
    node = h.make_node(
        "Scan", ["s0", "x"], ["s"], body=body, num_scan_inputs=1, scan_input_axes=[0, 1], name="sc"
    )
    graph = h.make_graph(
        [node], "g", [_value("s0", T.FLOAT, [2]), _value("x", T.FLOAT, [3, 2])], [_value("s", T.FLOAT, [2])]
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    with pytest.raises(
        ModelLoadError, match=r"node 'sc': invalid attributes for Scan: 'scan_input_axes' expects 1 values"
    ):
        flowrt.onnx.load(model, check=False)


def test_loop_body_whose_condition_is_not_bool_is_refused():
    body = h.make_graph(
        [h.make_node("Identity", ["v_in"], ["v_out"]), h.make_node("Cast", ["c"], ["c_float"], to=T.FLOAT)],
        "body",
        [_value("i", T.INT64, []), _value("c", T.BOOL, []), _value("v_in", T.FLOAT, None)],
        [_value("c_float", T.FLOAT, []), _value("v_out", T.FLOAT, None)],
    )
    node = h.make_node("Loop", ["M", "", "v0"], ["v"], body=body, name="lp")
    graph = h.make_graph(
        [node], "g", [_value("M", T.INT64, []), _value("v0", T.FLOAT, [2])], [_value("v", T.FLOAT, [2])]
    )
    net = flowrt.onnx.load(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), check=False)
    with pytest.raises(
        DataTypeError, match=r"layer 'lp' \(Loop\): Loop: the body's first output is the condition"
    ):
        flowrt.optimize(net, backends=["CpuRef"])


def test_saving_a_network_with_subgraphs_names_the_layer(tmp_path):
    optimized = flowrt.optimize(flowrt.onnx.load(_if_model()), backends=["CpuRef"])
    with pytest.raises(FlowrtError, match=r"layer 'If_0' \(If\) runs subgraphs"):
        flowrt.save(optimized, tmp_path / "m.flowrt")
    assert not (tmp_path / "m.flowrt").exists()
