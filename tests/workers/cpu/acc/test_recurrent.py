"""CpuAcc RNN, GRU and LSTM against CpuRef, and an ONNX model of them through the public API
against onnxruntime."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from recurrentcases import ACTIVATIONS, layer_cases, layer_inputs, node_model, run_onnxruntime

import flowrt
from flowrt.errors import ShapeError
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.registry import WorkloadInfo
from flowrt.types import DataType, TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.acc.kernels.recurrent import GATES, KINDS, PARALLEL_WEIGHTS
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels


def _run_both(op, inputs, attributes, num_outputs, *, constant=True, given_out=False):
    """CpuAcc's outputs (with W, R, B and P constants when ``constant``, written into outputs
    given when ``given_out``) and CpuRef's."""
    desc = make_descriptor(op, attributes, opset=22, num_outputs=num_outputs)
    expected = ref_kernels()[op](desc, *inputs)[:num_outputs]
    constants = tuple(a if constant and i in (1, 2, 3, 7) else None for i, a in enumerate(inputs))
    infos = tuple(None if a is None else TensorInfo.of(a) for a in inputs)
    info = WorkloadInfo(op.lower(), op, desc, infos, tuple(TensorInfo.of(e) for e in expected), constants)
    kernel = acc_kernels()[op](info, 2)
    outputs = [np.full(e.shape, np.nan, np.float32) for e in expected] if given_out else None
    got = kernel.execute(list(inputs), outputs)
    assert len(got) == num_outputs
    if given_out:
        assert all(g is o for g, o in zip(got, outputs, strict=True))
    return got, expected


def _close(got, expected):
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == np.float32 and g.shape == e.shape
        # float32 sums in another order, carried through the steps of a sequence; unbounded
        # activations (Affine with a slope above 1) may grow the state by orders of magnitude,
        # each step amplifying the rounding of the last (and cancelling it into smaller values):
        # errors count against the output's scale, more so the more doublings it went through
        scale = float(np.abs(e).max(initial=0.0))
        growth = max(1.0, np.log2(1.0 + scale))
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5 + 1e-4 * growth * max(0.0, scale - 1.0))


@settings(max_examples=25, deadline=None)
@given(layer_cases(), st.booleans(), st.booleans())
def test_layers_match_cpuref(case, constant, given_out):
    op, inputs, attributes, num_outputs = case
    _close(*_run_both(op, inputs, attributes, num_outputs, constant=constant, given_out=given_out))


@pytest.mark.parametrize(
    ("op", "attributes"),
    [
        ("LSTM", {}),
        ("LSTM", {"input_forget": 1, "clip": 2.0}),
        ("GRU", {"linear_before_reset": 0}),
        ("GRU", {"linear_before_reset": 1}),
    ],
)
@pytest.mark.parametrize("layout", [0, 1])
def test_a_large_r_split_over_the_workers_matches_cpuref(op, attributes, layout):
    # hidden 256: R holds at least PARALLEL_WEIGHTS floats, so the input projection and each
    # step's product by R (an LSTM's whole step, cells too) run as blocks on two threads;
    # batch 3, both directions, one entry shorter than the sequence and one empty
    hidden = 256
    assert GATES[KINDS[op]] * hidden * hidden >= PARALLEL_WEIGHTS
    inputs = layer_inputs(
        op, 4, 3, 8, hidden, direction="bidirectional", layout=layout, lengths=(4, 2, 0), seed=7, scale=0.1
    )
    attributes = {"hidden_size": hidden, "direction": "bidirectional", "layout": layout, **attributes}
    _close(*_run_both(op, inputs, attributes, 3 if op == "LSTM" else 2))


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_every_activation_matches_cpuref(activation):
    # as f, g and h in turn, with alpha and beta away from their defaults
    for op, count in (("GRU", 2), ("LSTM", 3)):
        inputs = layer_inputs(op, 4, 2, 3, 5, direction="bidirectional", seed=count, scale=0.6)
        for which in range(count):
            activations = ["Sigmoid", "Tanh", "Tanh"][:count] * 2
            activations[which] = activations[count + which] = activation
            attributes = {
                "direction": "bidirectional", "activations": activations, "clip": 2.0,
                "activation_alpha": [0.7] * 2 * count, "activation_beta": [0.3] * 2 * count,
            }  # fmt: skip
            _close(*_run_both(op, inputs, attributes, 3 if op == "LSTM" else 2))


def test_entries_past_their_length_get_zeros_in_planned_outputs():
    inputs = layer_inputs("GRU", 5, 3, 2, 4, direction="bidirectional", layout=1, lengths=[5, 1, 0], seed=2)
    attributes = {"direction": "bidirectional", "layout": 1}
    (y, y_h), expected = _run_both("GRU", inputs, attributes, 2, given_out=True)
    _close((y, y_h), expected)
    assert not y[1, 1:].any() and not y[2].any() and not y_h[2].any()


def test_weights_that_are_inputs_of_the_run_are_read_each_run():
    inputs = layer_inputs("LSTM", 3, 2, 2, 3, seed=4)
    _close(*_run_both("LSTM", inputs, {}, 3, constant=False))
    _close(*_run_both("LSTM", [inputs[0], inputs[1] * 2, *inputs[2:]], {}, 3, constant=False))


def test_a_mismatched_input_or_length_raises_before_the_kernel_runs():
    inputs = layer_inputs("RNN", 3, 2, 2, 3)
    desc = flowrt.descriptors.RNN()
    infos = tuple(TensorInfo.of(a) for a in inputs[:4])
    info = WorkloadInfo("rnn", "RNN", desc, infos, (TensorInfo((3, 1, 2, 3)),), (None,) * 4)
    kernel = acc_kernels()["RNN"](info, 2)
    with pytest.raises(ShapeError, match=r"RNN: input B of 6 values expected, got shape \(1, 5\)"):
        kernel.execute([*inputs[:3], inputs[3][:, :5]])
    with pytest.raises(ShapeError, match=r"sequence_lens of 2 values in \[0, 3\] expected, got \[3, -1\]"):
        kernel.execute([*inputs[:4], np.array([3, -1], np.int32)])


def test_non_float32_is_declined_with_a_reason():
    support = flowrt.backend_registry().get("CpuAcc").layer_support()
    x, w, r = (
        TensorInfo((2, 1, 3), DataType.FLOAT64),
        TensorInfo((1, 4, 3), DataType.FLOAT64),
        TensorInfo((1, 4, 4), DataType.FLOAT64),
    )
    answer = support.is_layer_supported("RNN", flowrt.descriptors.RNN(), [x, w, r], [None])
    assert not answer.supported and answer.reason == "CpuAcc RNN takes float32 only"
    lens = TensorInfo((1,), DataType.INT32)
    x, w, r = (i.with_dtype(DataType.FLOAT32) for i in (x, w, r))
    assert support.is_layer_supported(
        "RNN", flowrt.descriptors.RNN(), [x, w, r, None, lens], [None]
    ).supported


def test_onnx_model_runs_on_cpuacc_and_matches_onnxruntime():
    # an LSTM as exporters write one (weights constant, initial states of zeros, Y only), and
    # a GRU and an RNN on the same X with their Y_h only
    seq, batch, size, hidden = 6, 2, 5, 8
    lstm = layer_inputs("LSTM", seq, batch, size, hidden, seed=11)
    model, feeds = node_model("LSTM", lstm, {"hidden_size": hidden}, 1, constants=(1, 2, 3, 5, 6, 7))
    graph = model.graph
    graph.node[0].name = "lstm"
    for op, direction in (("GRU", "bidirectional"), ("RNN", "reverse")):
        weights = layer_inputs(op, seq, batch, size, hidden, direction=direction, seed=len(op))[1:4]
        names = [f"{op}_{n}" for n in ("W", "R", "B")]
        graph.initializer.extend(numpy_helper.from_array(a, n) for a, n in zip(weights, names, strict=True))
        graph.node.append(
            helper.make_node(
                op, ["X", *names], ["", f"{op}_Y_h"], name=op.lower(), direction=direction, hidden_size=hidden
            )
        )
        dirs = 2 if direction == "bidirectional" else 1
        graph.output.append(
            helper.make_tensor_value_info(f"{op}_Y_h", TensorProto.FLOAT, [dirs, batch, hidden])
        )
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["CpuAcc", "CpuRef"])
    assert opt.assignments() == {"lstm": "CpuAcc", "gru": "CpuAcc", "rnn": "CpuAcc"}
    got = flowrt.InferenceSession(opt).run(None, feeds)
    expected = run_onnxruntime(model, feeds)
    assert len(got) == 3
    for g, e in zip(got, expected, strict=True):
        # float32 sums in another order, carried through the steps of a sequence
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


_ONE_WORKER = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from recurrentcases import layer_inputs
from flowrt.frontends.onnx.descriptors import make_descriptor
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels
inputs = layer_inputs("LSTM", 4, 1, 8, 16, seed=3)
desc = make_descriptor("LSTM", {"hidden_size": 16}, opset=22, num_outputs=1)
expected = ref_kernels()["LSTM"](desc, *inputs)[0]
infos = tuple(None if a is None else TensorInfo.of(a) for a in inputs)
info = WorkloadInfo("lstm", "LSTM", desc, infos, (TensorInfo.of(expected),), (None,) * len(inputs))
got = acc_kernels()["LSTM"](info, 1).execute(list(inputs))[0]
print(float(np.abs(got - expected).max()))
"""


def test_a_one_worker_kernel_runs_in_a_process_with_no_runtime():
    # the first CpuAcc kernel of a fresh process, with one worker: the launcher the layer
    # links to is registered by the kernel itself
    tests = str(Path(__file__).resolve().parents[3])
    done = subprocess.run(
        [sys.executable, "-c", _ONE_WORKER, tests], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) < 1e-4
