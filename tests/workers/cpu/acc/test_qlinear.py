"""CpuAcc QLinearConv and QLinearMatMul against CpuRef (exact where the requantization scale
is a power of two, within one step otherwise), other forms declined; a QDQ model through the
public API folds onto them and matches ONNX Runtime."""

import numpy as np
import onnxruntime
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from kernelcases import run_on_acc
from qdqmodels import qdq_conv_model

import flowrt
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc import int8_gemm
from flowrt.workers.cpu.acc.conv import depthwise_int8
from flowrt.workers.cpu.acc.conv.int8_layout import PAD
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.acc.kernels import qlinear
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels


def _run_both(kind, desc, inputs, workers=2, given_outputs=False):
    expected = ref_kernels()[kind](desc, *inputs)
    constants = tuple(np.asarray(a) if i >= 1 else None for i, a in enumerate(inputs))
    infos = tuple(TensorInfo.of(np.asarray(a)) for a in inputs)
    info = WorkloadInfo("layer", kind, desc, infos, (TensorInfo.of(expected),), constants)
    assert acc_kernels()[kind].supports(info).supported
    _, got = run_on_acc(
        kind,
        desc,
        inputs,
        expected,
        constants,
        workers=workers,
        given_out=given_outputs,
        dtype=expected.dtype,
    )
    return got, expected


def _params(rng, filters, per_channel, w_zero, exact):
    """x_scale, x_zp, w_scale, w_zp, y_scale, y_zp; powers of two when ``exact``."""
    count = filters if per_channel else 1
    if exact:
        w_scale = (2.0 ** rng.integers(-9, -5, count)).astype(np.float32)
        x_scale, y_scale = np.float32(2.0**-6), np.float32(2.0**-3)
    else:
        w_scale = rng.uniform(0.001, 0.01, count).astype(np.float32)
        x_scale, y_scale = np.float32(0.0173), np.float32(0.0911)
    w_zp = rng.integers(-3, 4, count).astype(np.int8) if w_zero else np.zeros(count, np.int8)
    if not per_channel:
        w_scale, w_zp = w_scale.reshape(()), w_zp.reshape(())
    return x_scale, np.uint8(rng.integers(0, 256)), w_scale, w_zp, y_scale, np.uint8(rng.integers(0, 256))


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    channels=st.integers(1, 20),
    filters=st.integers(1, 20),
    size=st.integers(1, 11),
    kernel=st.sampled_from([1, 2, 3, 5]),
    stride=st.sampled_from([1, 2]),
    dilation=st.sampled_from([1, 2]),
    pad=st.integers(0, 2),
    batch=st.integers(1, 2),
    per_channel=st.booleans(),
    w_zero=st.booleans(),
    with_bias=st.booleans(),
    full_range=st.booleans(),
    given_outputs=st.booleans(),
)
def test_qlinear_conv_matches_cpuref(
    seed, channels, filters, size, kernel, stride, dilation, pad, batch, per_channel, w_zero, with_bias,
    full_range, given_outputs,
):  # fmt: skip
    rng = np.random.default_rng(seed)
    span = (kernel - 1) * dilation + 1
    if size + 2 * pad < span:
        pad = (span - size + 1) // 2
    x = rng.integers(0, 256, (batch, channels, size, size)).astype(np.uint8)
    limit = 127 if full_range else 63
    w = rng.integers(-limit - 1, limit + 1, (filters, channels, kernel, kernel)).astype(np.int8)
    x_scale, x_zp, w_scale, w_zp, y_scale, y_zp = _params(rng, filters, per_channel, w_zero, exact=True)
    inputs = [x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp]
    if with_bias:
        inputs.append(rng.integers(-5000, 5000, filters).astype(np.int32))
    desc = flowrt.descriptors.QLinearConv(
        pads=(pad,) * 4, strides=(stride, stride), dilations=(dilation, dilation)
    )
    got, expected = _run_both("QLinearConv", desc, inputs, given_outputs=given_outputs)
    np.testing.assert_array_equal(got, expected)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(1, 40),
    reduction=st.integers(1, 70),
    columns=st.integers(1, 40),
    leading=st.sampled_from([(), (2,), (2, 3)]),
    per_column=st.booleans(),
    w_zero=st.booleans(),
)
def test_qlinear_matmul_matches_cpuref(seed, rows, reduction, columns, leading, per_column, w_zero):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, (*leading, rows, reduction)).astype(np.uint8)
    b = rng.integers(-128, 128, (reduction, columns)).astype(np.int8)
    a_scale, a_zp, b_scale, b_zp, y_scale, y_zp = _params(rng, columns, per_column, w_zero, exact=True)
    inputs = [a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp]
    got, expected = _run_both("QLinearMatMul", flowrt.descriptors.QLinearMatMul(), inputs)
    np.testing.assert_array_equal(got, expected)


def test_any_scale_is_within_one_step_of_cpuref():
    rng = np.random.default_rng(7)
    x = rng.integers(0, 256, (1, 16, 9, 9)).astype(np.uint8)
    w = rng.integers(-64, 64, (24, 16, 3, 3)).astype(np.int8)
    params = _params(rng, 24, True, False, exact=False)
    inputs = [x, params[0], params[1], w, *params[2:], rng.integers(-999, 999, 24).astype(np.int32)]
    got, expected = _run_both("QLinearConv", flowrt.descriptors.QLinearConv(pads=(1, 1, 1, 1)), inputs)
    difference = got.astype(np.int16) - expected
    assert np.abs(difference).max() <= 1
    assert np.mean(difference != 0) < 0.01  # float32 requantization, as ONNX Runtime's


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"group": 2}, "one group"),
        ({"x": np.int8}, "uint8 data"),
    ],
)
def test_other_forms_are_declined(change, reason):
    x = np.zeros((1, 4, 5, 5), change.get("x", np.uint8))
    w = np.zeros((4, 4 // change.get("group", 1), 3, 3), np.int8)
    inputs = [
        x,
        np.float32(1),
        np.zeros((), x.dtype),
        w,
        np.float32(1),
        np.int8(0),
        np.float32(1),
        np.uint8(0),
    ]
    infos = tuple(TensorInfo.of(np.asarray(a)) for a in inputs)
    desc = flowrt.descriptors.QLinearConv(group=change.get("group", 1))
    info = WorkloadInfo(
        "layer", "QLinearConv", desc, infos, (TensorInfo((1, 4, 3, 3), flowrt.DataType.UINT8),)
    )
    support = acc_kernels()["QLinearConv"].supports(info)
    assert not support.supported and reason in support.reason


def test_a_qdq_model_folds_onto_cpuacc_and_matches_onnx_runtime():
    rng = np.random.default_rng(11)
    model = qdq_conv_model(rng, channels=16, filters=32, size=14)
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["CpuAcc", "CpuRef"])
    placed = {
        layer.kind: opt.decisions[layer.name].backend for layer in opt.graph if layer.name in opt.decisions
    }
    assert placed["QLinearConv"] == "CpuAcc" and placed["QLinearMatMul"] == "CpuAcc"
    assert sum("folded QDQ group" in p for p in opt.passes) == 2
    x = rng.uniform(-2, 2, (1, 16, 14, 14)).astype(np.float32)

    async def main():
        async with flowrt.Runtime() as rt:
            return (await (await rt.load(opt)).run({"x": x}))["y"]

    got = trio.run(main)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(got, session.run(None, {"x": x})[0])


@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize(
    ("channels", "filters", "size", "stride"),
    [
        (32, 70, 28, 1),  # many column tiles: the columns split across the workers
        (64, 90, 7, 1),  # 49 pixels: the rows (weights) split instead
        (3, 24, 200, 2),  # a stem: few channels, strided im2col split by kernel rows
    ],
)
def test_large_layers_split_across_workers_exactly(monkeypatch, portable, channels, filters, size, stride):
    if portable:  # the loops machines without AVX2 run (weights unpacked, a row per unit)
        monkeypatch.setattr("flowrt.workers.cpu.acc.int8_gemm.AVAILABLE", False)
    rng = np.random.default_rng(channels)
    x = rng.integers(0, 256, (1, channels, size, size)).astype(np.uint8)
    w = rng.integers(-64, 65, (filters, channels, 3, 3)).astype(np.int8)
    x_scale, x_zp, w_scale, w_zp, y_scale, y_zp = _params(rng, filters, True, False, exact=True)
    bias = rng.integers(-99, 99, filters).astype(np.int32)
    inputs = [x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias]
    desc = flowrt.descriptors.QLinearConv(pads=(1, 1, 1, 1), strides=(stride, stride))
    for workers in (2, 3):
        got, expected = _run_both("QLinearConv", desc, inputs, workers=workers)
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    ("channels", "filters", "size", "kernel", "pads", "dilation"),
    [
        (64, 37, 7, 3, (1, 1, 1, 1), 1),  # resnet50's 7x7 layers, fewer filters than panels
        (33, 20, 14, 3, (1, 1, 1, 1), 1),  # k a step short (297 = 4 * 74 + 1)
        (5, 9, 16, 5, (2, 0, 1, 3), 1),  # uneven pads; output rows 16 wide
        (6, 8, 12, 3, (2, 2, 2, 2), 2),  # dilated
        (3, 4, 1, 3, (1, 1, 1, 1), 1),  # one pixel
        (4, 6, 9, 1, (1, 0, 0, 1), 1),  # a padded 1x1
        (8, 20, 28, 3, (1, 1, 1, 1), 1),  # rows 28 wide, each on a whole block of 32 columns
        (4, 12, 60, 3, (1, 1, 1, 1), 1),  # rows 60 wide: the second block of each partly stored
        (6, 10, 20, 3, (1, 1, 1, 1), 1),  # rows 20 wide: a block of 32 would waste too much
    ],
)
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_stride_one_conv_multiplies_the_windows_of_its_padded_input(
    monkeypatch, channels, filters, size, kernel, pads, dilation, workers
):
    calls = []
    windows = qlinear.QLinearKernel._windows
    monkeypatch.setattr(
        qlinear.QLinearKernel, "_windows", lambda self, *a: calls.append(1) or windows(self, *a)
    )
    rng = np.random.default_rng(channels * 100 + size + workers)
    x = rng.integers(0, 256, (2, channels, size, size)).astype(np.uint8)
    w = rng.integers(-128, 128, (filters, channels, kernel, kernel)).astype(np.int8)
    x_scale, x_zp, w_scale, w_zp, y_scale, y_zp = _params(rng, filters, True, False, exact=True)
    bias = rng.integers(-5000, 5000, filters).astype(np.int32)
    inputs = [x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias]
    desc = flowrt.descriptors.QLinearConv(pads=pads, dilations=(dilation, dilation))
    got, expected = _run_both("QLinearConv", desc, inputs, workers=workers)
    np.testing.assert_array_equal(got, expected)
    # the portable loops multiply a column matrix; so do rows of 20, past the waste allowed
    assert bool(calls) == (int8_gemm.AVAILABLE and size != 20)


@pytest.mark.parametrize(
    ("kernel", "pad", "dilation", "size"),
    [(7, 3, 1, 32), (3, 1, 1, 14), (1, 0, 1, 8), (3, 2, 2, 12), (5, 2, 1, 10), (3, 1, 1, 13), (2, 0, 1, 6)],
)
def test_stride_two_windows_over_phase_planes_match_cpuref(kernel, pad, dilation, size):
    # an even plane halved by the window (a stem, a downsampling conv) is laid out from the
    # input's four phase planes; an odd one (13) or a window that does not halve it, row by row
    rng = np.random.default_rng(kernel * 100 + size)
    x = rng.integers(0, 256, (2, 3, size, size)).astype(np.uint8)
    w = rng.integers(-128, 128, (5, 3, kernel, kernel)).astype(np.int8)
    x_scale, x_zp, w_scale, w_zp, y_scale, y_zp = _params(rng, 5, True, False, exact=True)
    inputs = [x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp]
    desc = flowrt.descriptors.QLinearConv(pads=(pad,) * 4, strides=(2, 2), dilations=(dilation, dilation))
    got, expected = _run_both("QLinearConv", desc, inputs)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("weights", ["7-bit", "full-range", "portable"])
@pytest.mark.parametrize(("rows", "reduction", "columns"), [(100, 300, 70), (20, 130, 200), (3, 7, 5)])
def test_large_matmuls_split_across_workers_exactly(monkeypatch, weights, rows, reduction, columns):
    if weights == "portable":
        monkeypatch.setattr("flowrt.workers.cpu.acc.int8_gemm.AVAILABLE", False)
    rng = np.random.default_rng(rows)
    a = rng.integers(0, 256, (1, rows, reduction)).astype(np.uint8)
    limit = 128 if weights == "full-range" else 64  # the int16 kernel, else maddubs
    b = rng.integers(-limit, limit + 1 - (limit == 128), (reduction, columns)).astype(np.int8)
    a_scale, a_zp, b_scale, b_zp, y_scale, y_zp = _params(rng, columns, True, False, exact=True)
    inputs = [a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp]
    for workers in (1, 2, 3):
        got, expected = _run_both(
            "QLinearMatMul", flowrt.descriptors.QLinearMatMul(), inputs, workers=workers
        )
        np.testing.assert_array_equal(got, expected)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    channels=st.integers(2, 40),
    size=st.integers(1, 20),
    kernel=st.sampled_from([1, 3, 5]),
    stride=st.sampled_from([1, 2]),
    dilation=st.sampled_from([1, 2]),
    pad=st.integers(0, 2),
    batch=st.integers(1, 2),
    per_channel=st.booleans(),
    w_zero=st.booleans(),
    with_bias=st.booleans(),
    workers=st.sampled_from([1, 2, 3]),
    channels_last=st.booleans(),
)
def test_depthwise_qlinear_conv_matches_cpuref(
    seed,
    channels,
    size,
    kernel,
    stride,
    dilation,
    pad,
    batch,
    per_channel,
    w_zero,
    with_bias,
    workers,
    channels_last,
):
    rng = np.random.default_rng(seed)
    span = (kernel - 1) * dilation + 1
    if size + 2 * pad < span:
        pad = (span - size + 1) // 2
    x = rng.integers(0, 256, (batch, channels, size, size)).astype(np.uint8)
    w = rng.integers(-128, 128, (channels, 1, kernel, kernel)).astype(np.int8)
    x_scale, x_zp, w_scale, w_zp, y_scale, y_zp = _params(rng, channels, per_channel, w_zero, exact=True)
    inputs = [x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp]
    if with_bias:
        inputs.append(rng.integers(-5000, 5000, channels).astype(np.int32))
    desc = flowrt.descriptors.QLinearConv(
        group=channels, pads=(pad,) * 4, strides=(stride, stride), dilations=(dilation, dilation)
    )
    with pytest.MonkeyPatch.context() as patch:  # the plane-wise loops, or channels last, for any plane
        patch.setattr(depthwise_int8, "CHANNELS_LAST_PLANE", 1 << 30 if channels_last else 0)
        got, expected = _run_both("QLinearConv", desc, inputs, workers=workers)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("size", [2, 3, 7, 14, 20])
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("bias_limit", [5000, 1 << 28])
def test_a_three_by_three_depthwise_layer_matches_cpuref(size, workers, stride, bias_limit):
    # the float nine-tap loops over each plane (stride 1) or its phase planes (stride 2 on an
    # even plane) less the zero point, exact in float32; an odd plane of stride 2 row by row;
    # a bias past EXACT_BIAS added in int32, not in float32
    rng = np.random.default_rng(size * 10 + workers + stride * 100)
    channels = 37
    x = rng.integers(0, 256, (2, channels, size, size)).astype(np.uint8)
    x[0, :, 0, :] = 255  # the largest sums: 9 * 255 * 128
    w = rng.integers(-128, 128, (channels, 1, 3, 3)).astype(np.int8)
    w[:3] = -128
    x_scale, x_zp, w_scale, w_zp, y_scale, y_zp = _params(rng, channels, True, True, exact=True)
    bias = rng.integers(-bias_limit, bias_limit, channels).astype(np.int32)
    bias[0] = -bias_limit
    assert (bias_limit > depthwise_int8.EXACT_BIAS) == (bias_limit == 1 << 28)
    inputs = [x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias]
    desc = flowrt.descriptors.QLinearConv(group=channels, pads=(1,) * 4, strides=(stride, stride))
    with pytest.MonkeyPatch.context() as patch:  # plane-wise at every size
        patch.setattr(depthwise_int8, "CHANNELS_LAST_PLANE", 0)
        got, expected = _run_both("QLinearConv", desc, inputs, workers=workers)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    ("stride", "size", "dilation"),
    [
        (1, 57, 1),  # the output the input's size: one loop per cell over the plane
        (1, 40, 2),
        (2, 56, 1),  # half an even size: the phase planes
        (2, 57, 1),  # row by row
    ],
)
def test_a_large_depthwise_layer_splits_its_channels_exactly(stride, size, dilation):
    rng = np.random.default_rng(stride + size)
    x = rng.integers(0, 256, (1, 32, size, size)).astype(np.uint8)
    w = rng.integers(-128, 128, (32, 1, 3, 3)).astype(np.int8)
    x_scale, x_zp, w_scale, w_zp, y_scale, y_zp = _params(rng, 32, True, True, exact=True)
    inputs = [x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, rng.integers(-99, 99, 32).astype(np.int32)]
    desc = flowrt.descriptors.QLinearConv(
        group=32, pads=(dilation,) * 4, strides=(stride, stride), dilations=(dilation, dilation)
    )
    for workers in (2, 3):
        got, expected = _run_both("QLinearConv", desc, inputs, workers=workers, given_outputs=True)
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(("stride", "dilation"), [(1, 1), (2, 1), (1, 2)])
def test_a_small_plane_of_many_channels_splits_its_rows_exactly(stride, dilation):
    rng = np.random.default_rng(stride * 10 + dilation)
    size = 7 * stride  # a 7x7 output: channels last
    x = rng.integers(0, 256, (1, 960, size, size)).astype(np.uint8)
    w = rng.integers(-128, 128, (960, 1, 3, 3)).astype(np.int8)
    x_scale, x_zp, w_scale, w_zp, y_scale, y_zp = _params(rng, 960, True, True, exact=True)
    inputs = [x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, rng.integers(-99, 99, 960).astype(np.int32)]
    desc = flowrt.descriptors.QLinearConv(
        group=960, pads=(dilation,) * 4, strides=(stride, stride), dilations=(dilation, dilation)
    )
    assert 7 * 7 <= depthwise_int8.CHANNELS_LAST_PLANE and 960 * 7 * 7 >= depthwise_int8.PARALLEL_OUTPUTS
    for workers in (2, 3):
        got, expected = _run_both("QLinearConv", desc, inputs, workers=workers, given_outputs=True)
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("group", [1, 8])
def test_parameters_that_are_inputs_are_read_at_every_run(group):
    rng = np.random.default_rng(group)
    x = rng.integers(0, 256, (1, 8, 6, 6)).astype(np.uint8)
    w = rng.integers(-64, 65, (8, 8 // group, 3, 3)).astype(np.int8)
    desc = flowrt.descriptors.QLinearConv(group=group, pads=(1, 1, 1, 1))
    runs = []
    for y_scale in (np.float32(2.0**-3), np.float32(2.0**-2)):
        x_scale, x_zp, w_scale, w_zp, _, y_zp = _params(rng, 8, True, False, exact=True)
        runs.append([x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp])
    infos = tuple(TensorInfo.of(np.asarray(a)) for a in runs[0])
    constants = (None, None, None, w, None, None, None, None)  # only the weights are constants
    out = TensorInfo((1, 8, 6, 6), flowrt.DataType.UINT8)
    kernel = acc_kernels()["QLinearConv"](
        WorkloadInfo("layer", "QLinearConv", desc, infos, (out,), constants), 2
    )
    for inputs in runs + runs:
        (got,) = kernel.execute(inputs)
        np.testing.assert_array_equal(got, ref_kernels()["QLinearConv"](desc, *inputs))


@pytest.mark.parametrize("width", [1, 14, 63, 64, 65, 130])
@pytest.mark.parametrize("pads", [(1, 1, 1, 1), (0, 2, 3, 0)])
def test_the_padded_input_holds_each_plane_inside_its_zero_point(width, pads):
    # rows copied as masked vectors of 64 bytes where the host has AVX-512BW: shorter rows,
    # and rows past a vector, land whole and nothing beside them is overwritten
    top, left, bottom, right = pads
    rng = np.random.default_rng(width)
    x = rng.integers(0, 256, (3, 5, width)).astype(np.uint8)
    padded_h, pitch = 5 + top + bottom, width + left + right
    padded = np.full(3 * padded_h * pitch + 7, 9, np.uint8)
    bounds = np.array([0, 1, 3], np.int64)
    PAD.run(2, (bounds, x, np.uint8(200), top, left, padded_h, pitch, padded))
    expected = np.pad(x, ((0, 0), (top, bottom), (left, right)), constant_values=200)
    np.testing.assert_array_equal(padded[: expected.size].reshape(expected.shape), expected)
    assert (padded[expected.size :] == 9).all()
