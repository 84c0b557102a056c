"""CpuAcc activations against CpuRef, and CpuAcc in a whole model with fallback to CpuRef."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.engine.graph.layer_kind import activation_facts
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import epilogue
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.acc.kernels.activation import MIN_SLICE, ActivationKernel
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels

# (kind, attributes): every activation CpuAcc runs, the attributes away from their defaults
CASES = [
    ("Relu", {}), ("LeakyRelu", {}), ("Sigmoid", {}), ("Tanh", {}), ("HardSwish", {}),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.45}), ("Elu", {"alpha": 0.7}), ("Softplus", {}),
    ("Gelu", {}), ("Gelu", {"approximate": "tanh"}), ("Swish", {"alpha": 1.7}), ("Mish", {}),
    ("Clip", {"min": -2.5, "max": 6.0, "opset": 6}), ("Softsign", {}),
]  # fmt: skip
# Gelu is x/2 (1 + erf(x / sqrt 2)) in float32, as in onnxruntime: 1 + erf cancels for x < 0,
# leaving an absolute error of a few float32 ulps of 1 (CpuRef's runs in float64).
ATOL = {"Gelu": 1e-6}
EDGES = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-38, -1e-38, 1e-7, -1e-7, 0.5, -0.5,
     0.625, -0.625, 3.0, -3.0, 3.84, -3.84, 5.5, -5.5, 20.5, -20.5, 88.7, -88.7, 89.0, -89.0,
     104.0, -104.0, 1e4, -1e4, 3.4e38, -3.4e38],
    np.float32,
)  # fmt: skip


def test_cases_cover_every_activation_of_the_table_and_each_variant():
    facts = activation_facts()
    assert {kind for kind, _ in CASES} == set(facts)
    for kind, fact in facts.items():
        assert sum(k == kind for k, _ in CASES) >= 1 + len(fact.variants), kind


def test_epilogue_codes_are_the_table_codes_and_one_kernel_runs_every_activation():
    assert epilogue.CODES == {kind: fact.code for kind, fact in activation_facts().items()}
    assert epilogue.GELU_TANH == activation_facts()["Gelu"].variants["tanh"]
    assert {acc_kernels()[kind] for kind in activation_facts()} == {ActivationKernel}


def _run_both(kind, x, workers, **attributes):
    desc = getattr(flowrt.descriptors, kind)(**attributes)
    info = WorkloadInfo("layer", kind, desc, (TensorInfo.of(x),), (TensorInfo.of(x),), (None,))
    kernel = acc_kernels()[kind](info, workers)
    (got,) = kernel.execute([x])
    with np.errstate(all="ignore"):  # CpuRef's Swish divides -inf by inf
        expected = ref_kernels()[kind](desc, x)
    return kernel, got, np.asarray(expected)


@settings(max_examples=40, deadline=None)
@given(
    case=st.sampled_from(CASES),
    x=hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=1, max_dims=4, max_side=40),
        elements=st.floats(-100, 100, width=32),
    ),
    workers=st.integers(1, 4),
)
def test_activations_match_cpuref(case, x, workers):
    kind, attributes = case
    _, got, expected = _run_both(kind, x, workers, **attributes)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=ATOL.get(kind, 1e-7))


@pytest.mark.parametrize(("kind", "attributes"), CASES)
def test_edge_values_give_what_cpuref_gives(kind, attributes):
    # NaN, the infinities, subnormals, where exp over- and underflows, -0.0: the same value,
    # and a zero of the same sign
    _, got, expected = _run_both(kind, EDGES, 1, **attributes)
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=ATOL.get(kind, 0), equal_nan=True)
    zero = expected == 0
    assert (np.signbit(got[zero]) == np.signbit(expected[zero])).all(), EDGES[zero]


def test_large_inputs_split_across_workers_match_cpuref():
    x = np.random.default_rng(5).uniform(-30, 30, 3 * MIN_SLICE + 7).astype(np.float32)
    for kind, attributes in CASES:
        kernel, got, expected = _run_both(kind, x, 3, **attributes)
        assert kernel.bounds(x.size).shape[0] == 4
        np.testing.assert_allclose(got, expected, rtol=2e-6, atol=ATOL.get(kind, 1e-7), err_msg=kind)


def _clip(inputs, constants, opset=13):
    desc = flowrt.descriptors.Clip(opset=opset)
    x = inputs[0]
    infos = tuple(None if a is None else TensorInfo.of(a) for a in inputs)
    info = WorkloadInfo("clip", "Clip", desc, infos, (TensorInfo.of(x),), constants)
    (got,) = acc_kernels()["Clip"](info, 2).execute(list(inputs))
    return got, np.asarray(ref_kernels()["Clip"](desc, *inputs))


def test_clip_takes_constant_bounds_and_reads_the_others_per_run():
    x = np.linspace(-5, 5, 41, dtype=np.float32)
    low, high = np.array(-1.5, np.float32), np.array(2.0, np.float32)
    for inputs, constants in [
        ([x, low, high], (None, low, high)),  # both constant
        ([x, low], (None, low)),  # no max
        ([x, None, high], (None, None, high)),  # no min
        ([x, low, high], (None, None, None)),  # both computed at run time
        ([x, low, high], (None, low, None)),
    ]:
        got, expected = _clip(inputs, constants)
        np.testing.assert_array_equal(got, expected)
    # a bound read per run follows its input from one run to the next
    got, _ = _clip([x, np.array(0.5, np.float32), high], (None, None, high))
    assert got.min() == 0.5


def test_clip_with_min_above_max_gives_max_and_keeps_nan():
    x = np.array([-3, 0, 3, np.nan], np.float32)
    got, expected = _clip([x, np.array(2, np.float32), np.array(1, np.float32)], (None, None, None))
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got, [1, 1, 1, np.nan])


@pytest.mark.parametrize("alpha", [0.01, 0.2, 1.5])
def test_leaky_relu_uses_its_slope(alpha):
    x = np.linspace(-3, 3, 101, dtype=np.float32)
    _, got, expected = _run_both("LeakyRelu", x, 2, alpha=alpha)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_sigmoid_saturates_without_overflow():
    x = np.array([-1e4, -100, 0, 100, 1e4], np.float32)
    with np.errstate(over="raise"):
        _, got, _ = _run_both("Sigmoid", x, 1)
    np.testing.assert_allclose(got, [0, 0, 0.5, 1, 1], atol=1e-30)


def test_window_splits_into_one_slice_per_worker_only_when_worth_it():
    big = np.zeros(4 * MIN_SLICE, np.float32)
    kernel, _, _ = _run_both("Relu", big, 2)
    assert kernel.bounds(big.size).tolist() == [0, 2 * MIN_SLICE, 4 * MIN_SLICE]
    assert kernel.bounds(MIN_SLICE + 1).tolist() == [0, MIN_SLICE + 1]


def test_non_float32_is_declined_with_a_reason():
    support = flowrt.backend_registry().get("CpuAcc").layer_support()
    answer = support.is_layer_supported(
        "Relu", None, [TensorInfo((3,), "float64")], [TensorInfo((3,), "float64")]
    )
    assert not answer.supported and "float32 only" in answer.reason
    answer = support.is_layer_supported("TopK", None, [TensorInfo((1, 1, 3, 3))], [None])
    assert answer.reason == "no CpuAcc kernel for TopK"


def test_layer_without_a_cpuacc_kernel_falls_back_visibly(capsys):
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((2, 5)))
    relu = net.add_layer("Relu", inputs=[x], name="relu")
    cumsum = net.add_layer("CumSum", inputs=[relu, np.array(1, np.int64)], name="cumsum")
    net.add_output("y", cumsum)
    opt = flowrt.optimize(net, backends=["CpuAcc", "CpuRef"])
    assert opt.assignments() == {"relu": "CpuAcc", "cumsum": "CpuRef"}
    assert opt.decisions["cumsum"].declined == {"CpuAcc": "no CpuAcc kernel for CumSum"}
    data = np.linspace(-1, 1, 10, dtype=np.float32).reshape(2, 5)
    (y,) = flowrt.InferenceSession(opt).run(None, {"x": data})
    np.testing.assert_allclose(y, np.cumsum(np.maximum(data, 0), axis=1), rtol=1e-6)
    assert "declined by CpuAcc: no CpuAcc kernel for CumSum" in opt.report()
