"""CpuAcc pooling kernels against CpuRef, and in a whole model with fallback to CpuRef."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flowrt
from flowrt.models import expected_outputs, expected_tolerance, light_model, pattern_input
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels


def _run_both(kind, x, workers, given_outputs=False, **attributes):
    desc = getattr(flowrt.descriptors, kind)(**attributes)
    expected = np.asarray(ref_kernels()[kind](desc, x))
    info = WorkloadInfo("layer", kind, desc, (TensorInfo.of(x),), (TensorInfo.of(expected),), (None,))
    assert acc_kernels()[kind].supports(info).supported
    kernel = acc_kernels()[kind](info, workers)
    outputs = [np.full_like(expected, np.nan)] if given_outputs else None
    (got,) = kernel.execute([x], outputs)
    if given_outputs:
        assert got is outputs[0]
    assert got.dtype == np.float32 and got.shape == expected.shape
    return got, expected


@st.composite
def windowed_pools(draw):
    """A 2-D pool's attributes and an input it fits."""
    kernel = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    strides = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilations = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    attributes = {"kernel_shape": kernel, "strides": strides, "ceil_mode": draw(st.integers(0, 1))}
    if draw(st.booleans()):
        attributes["auto_pad"] = draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER", "VALID"]))
    else:
        # Pads smaller than the kernel, as ONNX asks.
        attributes["pads"] = tuple(draw(st.integers(0, k - 1)) for k in kernel * 2)
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 5)), *(draw(st.integers(s, s + 12)) for s in spans))
    x = np.random.default_rng(draw(st.integers(0, 2**16))).uniform(-10, 10, shape).astype(np.float32)
    return attributes, dilations, x


@settings(max_examples=30, deadline=None)
@given(pool=windowed_pools(), workers=st.integers(1, 3), given_outputs=st.booleans())
def test_max_pool_matches_cpuref(pool, workers, given_outputs):
    attributes, dilations, x = pool
    got, expected = _run_both("MaxPool", x, workers, given_outputs, dilations=dilations, **attributes)
    np.testing.assert_array_equal(got, expected)


@settings(max_examples=30, deadline=None)
@given(pool=windowed_pools(), workers=st.integers(1, 3), signed=st.booleans())
def test_max_pool_of_8_bit_values_matches_cpuref(pool, workers, signed):
    # a quantized model's MaxPool (fold_qdq drops its quantizers), on the 8-bit values
    attributes, dilations, x = pool
    low, dtype = (-128, np.int8) if signed else (0, np.uint8)
    values = np.random.default_rng(x.size).integers(low, low + 256, x.shape).astype(dtype)
    desc = flowrt.descriptors.MaxPool(dilations=dilations, **attributes)
    expected = np.asarray(ref_kernels()["MaxPool"](desc, values))
    info = WorkloadInfo(
        "layer", "MaxPool", desc, (TensorInfo.of(values),), (TensorInfo.of(expected),), (None,)
    )
    assert acc_kernels()["MaxPool"].supports(info).supported
    (got,) = acc_kernels()["MaxPool"](info, workers).execute([values])
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize(("size", "pads", "ceil"), [(112, 1, 0), (15, 1, 0), (16, 0, 1), (9, 1, 1)])
def test_a_stem_max_pool_of_8_bit_values_matches_cpuref(dtype, size, pads, ceil):
    # 3x3 windows of stride 2 (resnet50's stem pool): a loop of constant strides of its own
    info8 = np.iinfo(dtype)
    values = (
        np.random.default_rng(size).integers(info8.min, info8.max + 1, (1, 3, size, size + 1)).astype(dtype)
    )
    desc = flowrt.descriptors.MaxPool(kernel_shape=(3, 3), strides=(2, 2), pads=(pads,) * 4, ceil_mode=ceil)
    expected = np.asarray(ref_kernels()["MaxPool"](desc, values))
    info = WorkloadInfo(
        "layer", "MaxPool", desc, (TensorInfo.of(values),), (TensorInfo.of(expected),), (None,)
    )
    (got,) = acc_kernels()["MaxPool"](info, 2).execute([values])
    np.testing.assert_array_equal(got, expected)


@settings(max_examples=30, deadline=None)
@given(
    pool=windowed_pools(),
    include_pad=st.integers(0, 1),
    workers=st.integers(1, 3),
    given_outputs=st.booleans(),
)
def test_average_pool_matches_cpuref(pool, include_pad, workers, given_outputs):
    attributes, dilations, x = pool
    got, expected = _run_both(
        "AveragePool",
        x,
        workers,
        given_outputs,
        count_include_pad=include_pad,
        dilations=dilations,
        **attributes,
    )
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool_divisor_in_ceil_mode_excludes_cells_past_the_end_pad(include_pad):
    x = np.arange(2 * 3 * 7 * 7, dtype=np.float32).reshape(2, 3, 7, 7)
    got, expected = _run_both(
        "AveragePool",
        x,
        2,
        kernel_shape=(3, 3),
        strides=(2, 2),
        pads=(1, 1, 0, 0),
        ceil_mode=1,
        count_include_pad=include_pad,
    )
    assert got.shape == (2, 3, 4, 4)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_max_pool_lets_nan_win():
    x = np.zeros((1, 1, 4, 4), np.float32)
    x[0, 0, 1, 1] = np.nan
    got, expected = _run_both("MaxPool", x, 1, kernel_shape=(2, 2))
    np.testing.assert_array_equal(got, expected)
    assert np.isnan(got[0, 0, 0, 0]) and np.isnan(got[0, 0, 1, 1]) and not np.isnan(got[0, 0, 2, 2])


@pytest.mark.parametrize("kernel", [(1, 3), (2, 2), (3, 3), (5, 3)])
def test_strided_max_pools_run_row_by_row_and_let_nan_win(kernel):
    # The row path takes up to three kernel rows in one pass, then one at a time: a NaN on
    # any kernel row of a window reaches its output.
    x = np.random.default_rng(8).uniform(-10, 10, (1, 12, 13, 11)).astype(np.float32)
    for plane in range(12):
        x[0, plane, plane, (3 * plane) % 11] = np.nan
    x[0, 5, :, :] = -np.inf
    attributes = {"kernel_shape": kernel, "strides": (2, 2), "pads": (1, 0, 0, 1)}
    desc = flowrt.descriptors.MaxPool(**attributes)
    info = WorkloadInfo("layer", "MaxPool", desc, (TensorInfo.of(x),), (TensorInfo(None, x.dtype),), (None,))
    assert not acc_kernels()["MaxPool"](info, 2).plan(x.shape).flat
    got, expected = _run_both("MaxPool", x, 2, **attributes)
    np.testing.assert_array_equal(got, expected)
    assert np.isnan(got).sum() > 0


@pytest.mark.parametrize("width", [5, 15, 16, 17, 33, 47, 111])
@pytest.mark.parametrize(("pads", "ceil"), [((0, 0, 0, 0), 0), ((1, 1, 1, 1), 0), ((0, 1, 1, 0), 1)])
def test_three_by_three_stride_two_max_pools_match_cpuref_at_any_row_length(width, pads, ceil):
    # The classic window runs a vector of rows and of outputs at a time, a row's last part
    # masked: rows shorter than a vector, of whole vectors, and a part past them; a NaN in a
    # plane and a plane of -inf
    x = np.random.default_rng(width).uniform(-10, 10, (2, 3, 9, width)).astype(np.float32)
    x[1, 2, 4, width // 2] = np.nan
    x[0, 1] = -np.inf
    attributes = {"kernel_shape": (3, 3), "strides": (2, 2), "pads": pads, "ceil_mode": ceil}
    got, expected = _run_both("MaxPool", x, 2, **attributes)
    np.testing.assert_array_equal(got, expected)
    assert np.isnan(got[1, 2]).sum() > 0 and np.isinf(got[0, 1]).all()


@pytest.mark.parametrize("kind", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("workers", [1, 3])
def test_stride_one_pools_stack_padded_planes_and_match_cpuref(kind, workers):
    # Planes of 9x11 with 3x3 windows and pads: the flat path stacks many planes per pass.
    x = np.random.default_rng(5).uniform(-10, 10, (2, 40, 9, 11)).astype(np.float32)
    x[1, 7, 4, 4] = np.nan
    x[0, 3, 0, 0] = -np.inf
    attributes = {"kernel_shape": (3, 3), "pads": (1, 2, 1, 0), "dilations": (1, 2)}
    info_desc = getattr(flowrt.descriptors, kind)(**attributes)
    info = WorkloadInfo("layer", kind, info_desc, (TensorInfo.of(x),), (TensorInfo(None, x.dtype),), (None,))
    plan = acc_kernels()[kind](info, workers).plan(x.shape)
    assert plan.flat and plan.group > 1
    got, expected = _run_both(kind, x, workers, **attributes)
    np.testing.assert_array_equal(got, expected)
    assert np.isnan(got[1, 7]).sum() == np.isnan(expected[1, 7]).sum() > 0


@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize(
    "attributes",
    [
        {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)},
        {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (0, 1, 1, 0), "ceil_mode": 1},
        {"kernel_shape": (2, 2), "strides": (2, 2), "ceil_mode": 1},
        {"kernel_shape": (3, 2), "strides": (2, 3), "dilations": (2, 1)},
    ],
)
def test_strided_average_pools_stack_phase_planes_and_match_cpuref(attributes, include_pad):
    # shufflenet's 3x3 stride-2 pools, and 2x2 ones whose last window (ceil mode, odd planes)
    # is cut short: planes split into phase planes.
    x = np.random.default_rng(6).uniform(-10, 10, (2, 30, 13, 15)).astype(np.float32)
    desc = flowrt.descriptors.AveragePool(count_include_pad=include_pad, **attributes)
    info = WorkloadInfo(
        "layer", "AveragePool", desc, (TensorInfo.of(x),), (TensorInfo(None, x.dtype),), (None,)
    )
    plan = acc_kernels()["AveragePool"](info, 2).plan(x.shape)
    assert plan.flat and plan.group > 1 and not plan.whole
    got, expected = _run_both("AveragePool", x, 2, count_include_pad=include_pad, **attributes)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kernel", [(3, 3), (2, 3), (3, 4)])
def test_strided_max_pools_on_phase_planes_when_asked(kernel):
    # MaxPool keeps strided pools on its row path; forced onto the stacked phase planes, a
    # 3-wide kernel row is one pass (max in any order is exact) and other widths cell by cell.
    x = np.random.default_rng(9).uniform(-10, 10, (2, 30, 13, 15)).astype(np.float32)
    x[0, 4, :, :] = -np.inf
    attributes = {"kernel_shape": kernel, "strides": (2, 2), "pads": (1, 0, 1, 1)}
    desc = flowrt.descriptors.MaxPool(**attributes)
    expected = np.asarray(ref_kernels()["MaxPool"](desc, x))
    info = WorkloadInfo("layer", "MaxPool", desc, (TensorInfo.of(x),), (TensorInfo.of(expected),), (None,))
    kernel_ = acc_kernels()["MaxPool"](info, 2)
    kernel_.strided_flat = True
    assert kernel_.plan(x.shape).flat
    (got,) = kernel_.execute([x])
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("kind", ["AveragePool", "MaxPool"])
@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize(("height", "width", "ceil_mode"), [(14, 14, 0), (13, 15, 0), (2, 10, 1), (8, 6, 1)])
def test_2x2_stride_2_pools_halve_the_planes_as_cpuref(kind, workers, height, width, ceil_mode):
    # DenseNet's transitions; odd planes in floor mode leave their last row or column out.
    x = np.random.default_rng(height * width).uniform(-1e4, 1e4, (2, 17, height, width)).astype(np.float32)
    x[1, 3, 0, 1] = np.nan
    x[0, 5, 1, 0] = np.inf
    x[1, 4, 1, 1] = np.nan  # the last cell of its block
    attributes = {"kernel_shape": (2, 2), "strides": (2, 2), "ceil_mode": ceil_mode}
    desc = getattr(flowrt.descriptors, kind)(**attributes)
    info = WorkloadInfo("layer", kind, desc, (TensorInfo.of(x),), (TensorInfo(None, x.dtype),), (None,))
    assert acc_kernels()[kind](info, workers).plan(x.shape).halving
    got, expected = _run_both(kind, x, workers, given_outputs=True, **attributes)
    assert got.shape == (2, 17, height // 2, width // 2)
    np.testing.assert_array_equal(got, expected)
    assert np.isnan(got[1, 3, 0, 0]) and got[0, 5, 0, 0] == np.inf and np.isnan(got[1, 4, 0, 0])


@pytest.mark.parametrize("kind", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("workers", [1, 2])
def test_pools_whose_window_is_the_whole_plane_run_as_global_pools(kind, workers):
    # shufflenet's last AveragePool: a 7x7 kernel on 7x7 planes.
    x = np.random.default_rng(7).uniform(-10, 10, (2, 50, 7, 7)).astype(np.float32)
    x[1, 3, 2, 5] = np.nan
    desc = getattr(flowrt.descriptors, kind)(kernel_shape=(7, 7))
    info = WorkloadInfo("layer", kind, desc, (TensorInfo.of(x),), (TensorInfo(None, x.dtype),), (None,))
    assert acc_kernels()[kind](info, workers).plan(x.shape).whole
    padded = getattr(flowrt.descriptors, kind)(kernel_shape=(7, 7), pads=(1, 1, 1, 1))
    info = WorkloadInfo("layer", kind, padded, (TensorInfo.of(x),), (TensorInfo(None, x.dtype),), (None,))
    assert not acc_kernels()[kind](info, workers).plan(x.shape).whole
    got, expected = _run_both(kind, x, workers, kernel_shape=(7, 7))
    assert got.shape == (2, 50, 1, 1)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert np.isnan(got[1, 3, 0, 0]) and np.isnan(got).sum() == 1


@settings(max_examples=20, deadline=None)
@given(
    kind=st.sampled_from(["GlobalAveragePool", "GlobalMaxPool"]),
    shape=st.lists(st.integers(1, 9), min_size=3, max_size=5),
    workers=st.integers(1, 3),
    given_outputs=st.booleans(),
)
def test_global_pools_match_cpuref_bit_for_bit(kind, shape, workers, given_outputs):
    x = np.random.default_rng(sum(shape)).uniform(-10, 10, shape).astype(np.float32)
    got, expected = _run_both(kind, x, workers, given_outputs)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("shape", [(2, 4, 13, 13), (1, 3, 100, 100), (1, 2, 129)])
def test_global_average_pool_adds_in_numpys_pairwise_order(shape):
    # Near-equal planes: a float64 sum would round some of them one ulp apart.
    x = np.full(shape, 9.5e9 / 169, np.float32) + np.random.default_rng(0).uniform(0, 1, shape).astype(
        np.float32
    )
    got, expected = _run_both("GlobalAveragePool", x, 2)
    np.testing.assert_array_equal(got, expected)


def test_indices_output_non_float32_and_3d_pools_are_declined_with_a_reason():
    support = flowrt.backend_registry().get("CpuAcc").layer_support()
    x = TensorInfo((1, 2, 8, 8))
    two = flowrt.descriptors.MaxPool(kernel_shape=(2, 2), num_outputs=2)
    answer = support.is_layer_supported("MaxPool", two, [x], [x, x])
    assert not answer.supported and "Indices" in answer.reason
    pool = flowrt.descriptors.AveragePool(kernel_shape=(2, 2))
    answer = support.is_layer_supported("AveragePool", pool, [TensorInfo((1, 2, 8, 8), "float64")], [None])
    assert not answer.supported and "float32 only" in answer.reason
    cube = flowrt.descriptors.MaxPool(kernel_shape=(2, 2, 2))
    answer = support.is_layer_supported("MaxPool", cube, [TensorInfo((1, 2, 4, 4, 4))], [None])
    assert not answer.supported and "2-D pooling" in answer.reason


def test_alexnet_pools_normalizes_and_classifies_on_cpuacc():
    path = light_model("bvlc_alexnet")
    opt = flowrt.optimize(flowrt.onnx.load(path), backends=["CpuAcc", "CpuRef"])
    by_kind = {}
    for layer in opt.graph:
        if layer.backend:
            by_kind.setdefault(layer.kind, set()).add(layer.backend)
    assert by_kind["MaxPool"] == by_kind["LRN"] == by_kind["Softmax"] == {"CpuAcc"}
    sess = flowrt.InferenceSession(opt)
    feeds = {a.name: pattern_input(TensorInfo(a.shape)) for a in sess.get_inputs()}
    (y,) = sess.run(None, feeds)
    np.testing.assert_allclose(y, expected_outputs(path)[0], **expected_tolerance(path))
