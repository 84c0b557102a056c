"""CpuAcc Resize and Upsample against CpuRef: every coordinate mode and rounding, scales and
sizes, the split, and a decoder's upsampling through the public API against onnxruntime."""

import numpy as np
import onnx
import onnxruntime
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

import flowrt
from flowrt.engine.graph.layers.resize import COORDINATE_MODES, NEAREST_MODES
from flowrt.engine.scheduler.window import SplitHint
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels

MODES = [m for m in COORDINATE_MODES if m != "tf_crop_and_resize"]
FACTORS = [0.5, 0.6, 1.0, 1.5, 2.0, 2.0, 3.0]


def _run_both(kind, desc, inputs, *, workers=2, given_out=False, tiny_slices=False):
    """CpuAcc's and CpuRef's results for one layer; inputs after the data are constants."""
    expected = np.asarray(ref_kernels()[kind](desc, *inputs))
    infos = tuple(None if a is None else TensorInfo.of(a) for a in inputs)
    info = WorkloadInfo("resize", kind, desc, infos, (TensorInfo.of(expected),), (None, *inputs[1:]))
    kernel = acc_kernels()[kind](info, workers)
    if tiny_slices:
        kernel.split_hint = SplitHint(axis=0, min_slice=1)  # one output element (a row) a slice
    outputs = [np.full(expected.shape, np.nan, np.float32)] if given_out else None
    (got,) = kernel.execute(list(inputs), outputs)
    if given_out:
        assert got is outputs[0]
    assert got.dtype == np.float32 and got.shape == expected.shape
    return kernel, got, expected


@st.composite
def resizes(draw):
    """A random Resize (opset 10 or 11+, scales or sizes) or Upsample, with its inputs."""
    rank = draw(st.sampled_from([1, 2, 3, 4, 4, 4]))
    shape = tuple(draw(st.integers(1, 6)) for _ in range(rank))
    # mostly the last two dims, now and then a leading one too
    factors = [
        draw(st.sampled_from(FACTORS)) if a >= rank - 2 or draw(st.booleans()) else 1.0 for a in range(rank)
    ]
    x = np.random.default_rng(draw(st.integers(0, 2**16))).standard_normal(shape).astype(np.float32)
    mode = draw(st.sampled_from(["nearest", "linear"]))
    kind = draw(st.sampled_from(["Resize", "Resize", "Resize", "Upsample"]))
    scales = np.array(factors, np.float32)
    if kind == "Upsample":
        return kind, flowrt.descriptors.Upsample(mode=mode), [x, scales]
    opset = draw(st.sampled_from([10, 13, 19]))
    if opset == 10:
        return kind, flowrt.descriptors.Resize(mode=mode, opset=10), [x, scales]
    attrs = dict(
        mode=mode,
        coordinate_transformation_mode=draw(st.sampled_from(MODES)),
        nearest_mode=draw(st.sampled_from(NEAREST_MODES)),
        exclude_outside=draw(st.integers(0, 1)),
        opset=opset,
    )
    if draw(st.booleans()):
        return kind, flowrt.descriptors.Resize(**attrs), [x, None, scales]
    sizes = np.array(
        [max(1, round(n * f + draw(st.integers(-1, 1)))) for n, f in zip(shape, factors)], np.int64
    )
    if opset >= 18 and draw(st.booleans()):
        attrs["keep_aspect_ratio_policy"] = draw(st.sampled_from(["not_larger", "not_smaller"]))
    return kind, flowrt.descriptors.Resize(**attrs), [x, None, None, sizes]


@settings(max_examples=25, deadline=None)
@given(case=resizes(), workers=st.integers(1, 3), given_out=st.booleans(), tiny_slices=st.booleans())
def test_resize_matches_cpuref(case, workers, given_out, tiny_slices):
    kind, desc, inputs = case
    _, got, expected = _run_both(
        kind, desc, inputs, workers=workers, given_out=given_out, tiny_slices=tiny_slices
    )
    # nearest moves values, linear sums them as CpuRef does (leading dims blended at once)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("attrs", "doubled"),
    [
        (dict(mode="nearest"), False),
        (dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"), False),
        (dict(mode="linear"), True),
        (dict(mode="linear", coordinate_transformation_mode="align_corners"), True),
        (dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel"), True),
        (dict(mode="linear", coordinate_transformation_mode="asymmetric"), True),
    ],
)
@pytest.mark.parametrize("shape", [(1, 16, 24, 24), (2, 3, 5, 3)])
def test_x2_upsampling_splits_over_workers_and_matches_cpuref_exactly(attrs, doubled, shape):
    # linear columns that each blend two inputs at the same offsets for every column but the
    # first and last (a 2x upsampling's) are computed as two unit-stride rows, interleaved
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    inputs = [x, None, np.array([1, 1, 2, 2], np.float32)]
    kernel, got, expected = _run_both("Resize", flowrt.descriptors.Resize(**attrs), inputs)
    plan = kernel.plan(x.shape, inputs[1:])
    assert len(plan.bounds) == (3 if x.size > 1000 else 2)  # the small one is one slice
    assert bool(plan.dims[5]) == doubled
    np.testing.assert_array_equal(got, expected)


def test_runtime_scales_get_tables_of_their_own():
    x = np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)
    desc = flowrt.descriptors.Resize(mode="nearest")
    infos = (TensorInfo.of(x), None, TensorInfo((4,)))
    info = WorkloadInfo(
        "resize", "Resize", desc, infos, (TensorInfo((1, 1, None, None)),), (None, None, None)
    )
    kernel = acc_kernels()["Resize"](info, 1)
    for factors in ([1, 1, 2, 2], [1, 1, 1, 3], [1, 1, 2, 2]):
        scales = np.array(factors, np.float32)
        (got,) = kernel.execute([x, None, scales])
        np.testing.assert_array_equal(got, ref_kernels()["Resize"](desc, x, None, scales))
    assert len(kernel._plans) == 2


def _support(kind, desc, dtype="float32", shape=(1, 3, 8, 8)):
    support = flowrt.backend_registry().get("CpuAcc").layer_support()
    return support.is_layer_supported(kind, desc, [TensorInfo(shape, dtype), None, TensorInfo((4,))], [None])


@pytest.mark.parametrize(
    "attrs, reason",
    [
        (dict(mode="cubic"), "nearest and linear modes only, not cubic"),
        (dict(mode="linear", antialias=1), "does not take antialias"),
        (dict(coordinate_transformation_mode="tf_crop_and_resize"), "does not take tf_crop_and_resize"),
    ],
)
def test_unsupported_resize_is_declined_with_a_reason(attrs, reason):
    answer = _support("Resize", flowrt.descriptors.Resize(**attrs))
    assert not answer.supported and reason in answer.reason
    assert _support("Resize", flowrt.descriptors.Resize(mode="nearest", antialias=1)).supported


def test_non_float32_resize_is_declined_with_a_reason():
    answer = _support("Upsample", flowrt.descriptors.Upsample(), dtype="uint8")
    assert not answer.supported and answer.reason == "CpuAcc Upsample takes float32 only"


def test_decoder_upsampling_runs_on_cpuacc_and_matches_onnxruntime():
    scales = helper.make_tensor("scales", onnx.TensorProto.FLOAT, (4,), [1, 1, 2, 2])
    nodes = [
        helper.make_node("Resize", ["x", "", "scales"], ["near"], name="nearest", mode="nearest"),
        helper.make_node(
            "Resize", ["near", "", "scales"], ["y"], name="bilinear", mode="linear",
            coordinate_transformation_mode="align_corners",
        ),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "decoder", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (1, 4, 7, 9))],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, (1, 4, 28, 36))], [scales],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["CpuAcc", "CpuRef"])
    assert opt.assignments() == {"nearest": "CpuAcc", "bilinear": "CpuAcc"}
    x = np.random.default_rng(2).standard_normal((1, 4, 7, 9)).astype(np.float32)
    (y,) = flowrt.InferenceSession(opt).run(None, {"x": x})
    (expected,) = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    # onnxruntime weighs the four neighbours in its own order: a few ulps of 1 apart
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
