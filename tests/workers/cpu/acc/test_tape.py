"""CpuAcc's tape: small elementwise workloads bound to fixed arrays and run as one call give
what their kernels give one by one, and big or unbindable work is left to the kernels."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flowrt
from flowrt.registry import FusedActivation, WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.acc.kernels.activation import MIN_SLICE
from flowrt.workers.cpu.acc.launches import LAUNCHES
from flowrt.workers.cpu.acc.tape import Tape, bind

ACTIVATIONS = [
    None,
    FusedActivation("Relu"),
    FusedActivation("LeakyRelu", 0.2),
    FusedActivation("Clip", -0.5, 0.5),
]


def _kernel(kind, inputs, out_shape, activation=None, descriptor=None, workers=2):
    info = WorkloadInfo(
        kind.lower(), kind, descriptor, tuple(TensorInfo.of(x) for x in inputs),
        (TensorInfo(out_shape),), (None,) * len(inputs), activation,
    )  # fmt: skip
    return acc_kernels()[kind](info, workers)


# Shapes of a binary op's operands: equal, a row, a per-channel constant, a scalar, both ways.
SHAPES = [
    ((2, 3, 4), (2, 3, 4)),
    ((2, 3, 4), (4,)),
    ((2, 3, 4), (3, 1)),
    ((2, 3, 4), ()),
    ((3, 1), (1, 5)),
    ((1,), (6, 2)),
]


@settings(max_examples=25, deadline=None)
@given(
    shapes=st.sampled_from(SHAPES),
    kinds=st.lists(st.sampled_from(["Add", "Sub", "Mul", "Div"]), min_size=1, max_size=4),
    activation=st.sampled_from(ACTIVATIONS),
    then=st.sampled_from(["Relu", "Sigmoid", "Tanh", "LeakyRelu"]),
    seed=st.integers(0, 2**16),
)
def test_tape_matches_the_kernels_one_by_one(shapes, kinds, activation, then, seed):
    rng = np.random.default_rng(seed)
    a_shape, b_shape = shapes
    out_shape = np.broadcast_shapes(a_shape, b_shape)
    a = rng.standard_normal(a_shape).astype(np.float32)
    constants = [rng.uniform(0.5, 2, b_shape).astype(np.float32) for _ in kinds]
    # One pool's tensors: each layer's output, fixed arrays the tape writes.
    planned = [np.full(out_shape, np.nan, np.float32) for _ in range(len(kinds) + 1)]
    expected, x, calls = a, a, []
    for i, (kind, c) in enumerate(zip(kinds, constants)):
        kernel = _kernel(kind, [x if i else a, c], out_shape, activation)
        (expected,) = kernel.execute([expected, c])
        calls.append(bind(kernel, [x, c], [planned[i]]))
        x = planned[i]
    relu = _kernel(then, [x], out_shape, descriptor=getattr(flowrt.descriptors, then)())
    (expected,) = relu.execute([expected])
    calls.append(bind(relu, [x], [planned[-1]]))
    assert all(call is not None and call.program is LAUNCHES for call in calls)
    Tape.compile(calls)()
    np.testing.assert_array_equal(planned[-1], expected)


def test_view_layers_bind_to_a_view_of_their_input_and_add_no_instruction():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    shape = np.array([4, 3], np.int64)
    info = WorkloadInfo(
        "r", "Reshape", flowrt.descriptors.Reshape(), (TensorInfo.of(x), TensorInfo.of(shape)),
        (TensorInfo((4, 3)),), (None, shape),
    )  # fmt: skip
    call = bind(acc_kernels()["Reshape"](info, 2), [x, shape], [None])
    assert call is not None and call.instruction is None
    (view,) = call.outputs
    assert view.shape == (4, 3) and np.shares_memory(view, x)


def test_work_for_more_than_one_thread_is_left_to_its_kernel():
    big = np.ones(4 * MIN_SLICE, np.float32)
    relu = _kernel("Relu", [big], big.shape, descriptor=flowrt.descriptors.Relu())
    assert bind(relu, [big], [np.empty_like(big)]) is None
    small = big[:64]
    assert bind(relu, [small], [np.empty_like(small)]) is not None


@pytest.mark.parametrize("why", ["unplanned output", "non-contiguous input", "three inputs"])
def test_workloads_the_tape_cannot_take_are_not_bound(why):
    a = np.ones((4, 6), np.float32)
    out = np.empty((4, 6), np.float32)
    if why == "unplanned output":
        kernel, inputs, outputs = _kernel("Add", [a, a], a.shape), [a, a], [None]
    elif why == "non-contiguous input":
        t = np.ones((6, 4), np.float32).T
        kernel, inputs, outputs = _kernel("Add", [t, a], a.shape), [t, a], [out]
    else:
        kernel, inputs, outputs = _kernel("Sum", [a, a, a], a.shape), [a, a, a], [out]
    assert bind(kernel, inputs, outputs) is None


def test_a_workload_that_may_join_a_tape_compiles_the_tape_when_it_is_prepared(monkeypatch):
    import flowrt.workers.cpu.acc.tape as tape
    from flowrt.workers.cpu.acc.workload_factory import AccWorkload

    compiled = []
    monkeypatch.setattr(tape.run_tape, "compile", lambda signature: compiled.append(signature))
    monkeypatch.setattr(tape.run_tape, "overloads", {})
    x = np.ones((2, 3), np.float32)
    relu = _kernel("Relu", [x], (2, 3))
    workload = AccWorkload(relu, relu.info)
    workload.prepare()
    # at load, then, not in the first run; a kernel the tape never takes compiles nothing
    assert compiled == [tape._TAPE_SIGNATURE]
    softmax = _kernel("Softmax", [x], (2, 3), descriptor=flowrt.descriptors.Softmax(axis=-1))
    AccWorkload(softmax, softmax.info).prepare()
    assert compiled == [tape._TAPE_SIGNATURE]
