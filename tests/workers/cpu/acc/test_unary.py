"""CpuAcc unary math (Exp, Log, Sqrt, Neg, Abs, Reciprocal, Erf, Floor, Ceil, Round, Sin, Cos,
Sign) against CpuRef, fastmath's accuracy and vectorization, and a network of the unary,
activation and Pow/Max/Min kernels through the public API against onnxruntime."""

import math
import platform

import numpy as np
import onnx
import onnxruntime
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from numba import njit
from onnx import helper

import flowrt
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import fastmath
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.acc.kernels.activation import MIN_SLICE
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels

KINDS = [
    "Exp",
    "Log",
    "Sqrt",
    "Neg",
    "Abs",
    "Reciprocal",
    "Erf",
    "Floor",
    "Ceil",
    "Round",
    "Sin",
    "Cos",
    "Sign",
]
# erf is within 6 float32 ulps of 1 (CpuRef's is float64's); sin and cos are libm's sinf and
# cosf, a last-bit apart from numpy's own where they cross zero.
ATOL = {"Erf": 1e-6, "Sin": 1e-6, "Cos": 1e-6}
EDGES = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-38, -1e-38, 1e-7, -1e-7, 0.5, -0.5,
     1.5, -1.5, 2.5, -2.5, 1.0, -1.0, 3.83, -3.83, 88.7, 88.8, -103.9, -104.0, 8388609.0,
     -8388609.0, 3.4e38, -3.4e38],
    np.float32,
)  # fmt: skip


def _run_both(kind, x, workers, **attributes):
    desc = getattr(flowrt.descriptors, kind)(**attributes)
    info = WorkloadInfo("layer", kind, desc, (TensorInfo.of(x),), (TensorInfo.of(x),), (None,))
    kernel = acc_kernels()[kind](info, workers)
    (got,) = kernel.execute([x])
    with np.errstate(all="ignore"):
        expected = np.asarray(ref_kernels()[kind](desc, x))
    return kernel, got, expected


@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    x=hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=0, max_dims=4, max_side=30),
        elements=st.floats(-100, 100, width=32),
    ),
    workers=st.integers(1, 3),
)
def test_unary_math_matches_cpuref(kind, x, workers):
    _, got, expected = _run_both(kind, x, workers)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=ATOL.get(kind, 1e-7), equal_nan=True)


@pytest.mark.parametrize("kind", KINDS)
def test_edge_values_give_what_cpuref_gives(kind):
    # NaN, the infinities, subnormals, where exp over- and underflows, halves (Round: to even),
    # -0.0: the same value, and a zero of the same sign
    _, got, expected = _run_both(kind, EDGES, 1)
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=ATOL.get(kind, 0), equal_nan=True)
    zero = expected == 0
    assert (np.signbit(got[zero]) == np.signbit(expected[zero])).all(), EDGES[zero]


def test_large_inputs_split_across_workers_match_cpuref():
    x = np.random.default_rng(4).uniform(-50, 50, 3 * MIN_SLICE + 5).astype(np.float32)
    out = np.full_like(x, np.nan)
    for kind in KINDS:
        kernel, got, expected = _run_both(kind, x, 3)
        assert kernel.bounds(x.size).shape[0] == 4
        np.testing.assert_allclose(got, expected, rtol=2e-6, atol=ATOL.get(kind, 1e-7), equal_nan=True)
        # the planned output is written in place
        assert kernel.execute([x], [out])[0] is out
        np.testing.assert_array_equal(out, got)


def _ulps(got, exact):
    """|got - exact| in float32 ulps of ``exact`` (the spacing of its binade; 2**-149 below)."""
    _, exponent = np.frexp(exact)
    ulp = np.ldexp(1.0, np.maximum(exponent - 24, -149))
    return np.abs(got.astype(np.float64) - exact) / ulp


def test_fastmath_is_within_its_ulps_and_erf_within_4e7():
    rng = np.random.default_rng(7)
    wide = rng.uniform(-103, 88, 200_000).astype(np.float32)
    near_zero = rng.uniform(-1, 1, 50_000).astype(np.float32)
    # positive floats of every exponent, subnormals included
    positive = np.abs(rng.standard_normal(100_000)) * 10.0 ** rng.integers(-44, 38, 100_000)
    positive = positive.astype(np.float32)[(positive > 1e-45) & (positive < 3e38)]
    for kind, x, exact, ulps in [
        ("Exp", wide, np.exp(wide.astype(np.float64)), 1.5),
        ("Log", positive, np.log(positive.astype(np.float64)), 1.5),
        ("Tanh", near_zero * 10, np.tanh(near_zero.astype(np.float64) * 10), 2),
        ("Sigmoid", wide, 1 / (1 + np.exp(-wide.astype(np.float64))), 2.5),
        ("Softplus", wide, np.logaddexp(0, wide.astype(np.float64)), 2.5),
    ]:
        _, got, _ = _run_both(kind, x, 1)
        finite = np.isfinite(exact) & (exact != 0)
        assert _ulps(got[finite], exact[finite]).max() <= ulps, kind
    # Elu below 0 is expm1, accurate near 0 where exp(x) - 1 is not
    _, got, _ = _run_both("Elu", near_zero, 1)
    negative = near_zero < 0
    assert _ulps(got[negative], np.expm1(near_zero[negative].astype(np.float64))).max() <= 2
    x = np.concatenate([wide / 20, near_zero * 1e-3])
    _, got, _ = _run_both("Erf", x, 1)
    assert np.abs(got - np.vectorize(math.erf)(x.astype(np.float64))).max() <= 4e-7


@njit(error_model="numpy")  # not cached: inspect_asm needs a compile in this process
def _fastmath_sum(x, out):
    for j in range(x.shape[0]):
        v = x[j]
        out[j] = fastmath.exp(v) + fastmath.log(v) + fastmath.erf(v) + fastmath.tanh(v) + fastmath.sigmoid(v)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="reads x86 assembly")
def test_fastmath_loops_vectorize_without_libm_calls():
    x = np.linspace(0.1, 2, 64, dtype=np.float32)
    _fastmath_sum(x, np.empty_like(x))
    asm = "".join(_fastmath_sum.inspect_asm().values())
    assert "mulps" in asm  # packed: four or eight floats per instruction
    for libm in ("expf", "logf", "erff", "tanhf"):
        assert libm not in asm


def test_non_float32_is_declined_with_a_reason():
    support = flowrt.backend_registry().get("CpuAcc").layer_support()
    answer = support.is_layer_supported("Abs", None, [TensorInfo((3,), "int64")], [TensorInfo((3,), "int64")])
    assert not answer.supported and answer.reason == "CpuAcc Abs takes float32 only"


def _node(op, inputs, output, **attributes):
    return helper.make_node(op, inputs, [output], name=output, **attributes)


def _math_network():
    """A network of every unary, activation, Pow, Max and Min kind, one output per branch."""
    const = [
        helper.make_tensor(name, onnx.TensorProto.FLOAT, (), [value])
        for name, value in [("two", 2.0), ("half", 0.5), ("p", 1.7), ("lo", -1.5), ("hi", 2.5)]
    ]
    unary = ["Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "Abs", "Neg"]
    activations = [
        ("Relu", {}), ("LeakyRelu", {"alpha": 0.2}), ("Sigmoid", {}), ("Tanh", {}), ("HardSwish", {}),
        ("HardSigmoid", {"alpha": 0.3}), ("Elu", {"alpha": 0.8}), ("Softplus", {}), ("Mish", {}),
        ("Gelu", {}), ("Gelu", {"approximate": "tanh"}), ("Swish", {"alpha": 1.3}),
    ]  # fmt: skip
    nodes = [_node(op, ["x"], f"u_{op}") for op in unary]
    nodes += [_node(op, ["x"], f"a{i}_{op}", **attrs) for i, (op, attrs) in enumerate(activations)]
    nodes += [
        _node("Clip", ["x", "lo", "hi"], "clip"),
        # exp(-|x|) in (0, 1], its reciprocal >= 1, whose log >= 0: each op in its domain
        _node("Neg", ["u_Abs"], "minus_abs"), _node("Exp", ["minus_abs"], "exp"),
        _node("Reciprocal", ["exp"], "reciprocal"), _node("Log", ["reciprocal"], "log"),
        _node("Sqrt", ["log"], "sqrt"), _node("Erf", ["sqrt"], "erf"),
        _node("Pow", ["x", "two"], "square"), _node("Pow", ["u_Abs", "half"], "root"),
        _node("Pow", ["u_Abs", "p"], "power"), _node("Pow", ["u_Abs", "x"], "power_of_x"),
        _node("Max", ["x", "u_Sin", "u_Cos"], "max"), _node("Min", ["x", "u_Sin"], "min"),
    ]  # fmt: skip
    outputs = [n.output[0] for n in nodes]
    graph = helper.make_graph(
        nodes,
        "math",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (2, 3, 16, 16))],
        [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, (2, 3, 16, 16)) for name in outputs],
        const,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])


def test_math_network_runs_entirely_on_cpuacc_and_matches_onnxruntime():
    model = _math_network()
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["CpuAcc", "CpuRef"])
    assert set(opt.assignments().values()) == {"CpuAcc"}, opt.report()
    x = (np.random.default_rng(3).standard_normal((2, 3, 16, 16)) * 3).astype(np.float32)
    x.flat[:6] = [0.5, -2.5, 0.0, -0.0, 1.5, 3.0]  # halves round to even
    got = flowrt.InferenceSession(opt).run(None, {"x": x})
    expected = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    for name, g, e in zip((o.name for o in model.graph.output), got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6, err_msg=name)
