"""CpuAcc ConvTranspose against CpuRef: every geometry, the split, both GEMMs, and a U-Net
decoder's upsampling through the public API against onnxruntime."""

import numpy as np
import onnx
import onnxruntime
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from kernelcases import close, run_on_acc
from onnx import helper

import flowrt
from flowrt.engine.graph.layers.conv import conv_transpose_geometry
from flowrt.errors import BackendError, ShapeError
from flowrt.registry import FusedActivation, WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels


def transpose_case(x, w, b=None, *, workers=2, constant=True, given_out=False, tune=None, **attrs):
    """CpuAcc's kernel, its result and CpuRef's for one layer."""
    desc = flowrt.descriptors.ConvTranspose(**attrs)
    inputs = [x, w] if b is None else [x, w, b]
    expected = np.asarray(ref_kernels()["ConvTranspose"](desc, *inputs))
    constants = (None, w, b) if constant else (None, None, None)
    kernel, got = run_on_acc(
        "ConvTranspose", desc, inputs, expected, constants, workers=workers, given_out=given_out, tune=tune
    )
    return kernel, got, expected


@st.composite
def transposed_convolutions(draw):
    """A random 1-D or 2-D ConvTranspose: data, weights, optional bias and attributes, its
    output size set by pads (with output_padding), auto_pad or output_shape."""
    rank = draw(st.sampled_from([1, 2, 2]))
    group = draw(st.sampled_from([1, 1, 2, 3]))
    cg, mg = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    kernel = tuple(draw(st.integers(1, 4)) for _ in range(rank))
    strides = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    dilations = tuple(draw(st.integers(1, 2)) for _ in range(rank))
    spatial = tuple(draw(st.integers(1, 7)) for _ in range(rank))
    attrs = dict(group=group, strides=strides, dilations=dilations)
    sizing = draw(st.sampled_from(["pads", "pads", "auto_pad", "output_shape"]))
    if sizing == "pads":
        attrs["pads"] = tuple(draw(st.integers(-1, 3)) for _ in range(2 * rank))
        attrs["output_padding"] = tuple(draw(st.integers(0, 2)) for _ in range(rank))
    elif sizing == "auto_pad":
        attrs["auto_pad"] = draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER", "VALID"]))
    else:
        full = [s * (n - 1) + (k - 1) * d + 1 for s, n, k, d in zip(strides, spatial, kernel, dilations)]
        attrs["output_shape"] = tuple(max(1, f + draw(st.integers(-3, 2))) for f in full)
    desc = flowrt.descriptors.ConvTranspose(**attrs)
    try:
        conv_transpose_geometry(desc, spatial, kernel)
    except ShapeError:
        assume(False)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.standard_normal((draw(st.integers(1, 2)), group * cg, *spatial), dtype=np.float32)
    w = rng.standard_normal((group * cg, mg, *kernel), dtype=np.float32)
    b = rng.standard_normal(group * mg, dtype=np.float32) if draw(st.booleans()) else None
    return x, w, b, attrs


def _many_slices(kernel):
    # One phase row per slice and per block, few channels per chunk: every boundary is crossed.
    kernel.min_slice_macs = 1
    kernel.block_floats = 1
    kernel.chunk_floats = 1


def _by_blas(kernel):
    kernel.weights = kernel._pack(kernel.info.constants[1], tiles=False)


@settings(max_examples=25, deadline=None)
@given(
    case=transposed_convolutions(),
    workers=st.integers(1, 3),
    constant=st.booleans(),
    given_out=st.booleans(),
    tiny_slices=st.booleans(),
    blas=st.booleans(),
)
def test_conv_transpose_matches_cpuref(case, workers, constant, given_out, tiny_slices, blas):
    x, w, b, attrs = case
    tunes = [t for t, on in ((_many_slices, tiny_slices), (_by_blas, blas and constant)) if on]
    _, got, expected = transpose_case(
        x, w, b, workers=workers, constant=constant, given_out=given_out,
        tune=lambda k: [t(k) for t in tunes], **attrs,
    )  # fmt: skip
    close(got, expected)


@pytest.mark.parametrize(
    "w_shape, attrs",
    [
        ((32, 16, 2, 2), dict(strides=(2, 2))),  # each input pixel its own 2x2 block
        ((32, 16, 4, 4), dict(strides=(2, 2), pads=(1, 1, 1, 1))),  # four cells per phase
        ((32, 16, 3, 3), dict(strides=(2, 2), pads=(1, 1, 1, 1), output_padding=(1, 1))),
    ],
)
def test_unet_upsampling_splits_over_workers_and_matches_cpuref(w_shape, attrs):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 32, 24, 24), dtype=np.float32)
    w = rng.standard_normal(w_shape, dtype=np.float32)
    b = rng.standard_normal(16, dtype=np.float32)
    kernel, got, expected = transpose_case(x, w, b, workers=2, **attrs)
    plan = kernel.plan(x.shape, w.shape, 2)
    assert plan.parallel and len(plan.bands) == 3
    assert got.shape == (1, 16, 48, 48)
    close(got, expected)


def test_1d_conv_transpose_splits_its_output_channels_over_workers():
    # one row: no bands to split, so the slices take a part of the output channels each
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 64, 50), dtype=np.float32)
    w = rng.standard_normal((64, 48, 8), dtype=np.float32)
    kernel, got, expected = transpose_case(x, w, workers=3, strides=(4,), pads=(2, 2))
    plan = kernel.plan(x.shape, w.shape, 3)
    assert plan.parallel and len(plan.bands) == 2 and len(plan.parts) == 4
    close(got, expected)


def _support(dtype, x_shape, w_shape):
    support = flowrt.backend_registry().get("CpuAcc").layer_support()
    infos = [TensorInfo(x_shape, dtype), TensorInfo(w_shape, dtype)]
    return support.is_layer_supported("ConvTranspose", flowrt.descriptors.ConvTranspose(), infos, [None])


def test_non_float32_conv_transpose_is_declined_with_a_reason():
    answer = _support("float64", (1, 3, 8, 8), (3, 4, 3, 3))
    assert not answer.supported and answer.reason == "CpuAcc ConvTranspose takes float32 only"


def test_3d_conv_transpose_is_declined_with_a_reason():
    answer = _support("float32", (1, 3, 4, 8, 8), (3, 4, 3, 3, 3))
    assert not answer.supported and "1-D or 2-D spatial data only, got 3-D" in answer.reason
    assert _support("float32", (1, 3, 8), (3, 4, 3)).supported


def test_fused_activation_is_refused_at_load():
    x, w = np.ones((1, 2, 3, 3), np.float32), np.ones((2, 1, 2, 2), np.float32)
    infos = (TensorInfo.of(x), TensorInfo.of(w))
    desc = flowrt.descriptors.ConvTranspose(strides=(2, 2))
    info = WorkloadInfo(
        "up", "ConvTranspose", desc, infos, (TensorInfo((1, 1, 6, 6)),), (None, w), FusedActivation("Relu")
    )
    with pytest.raises(BackendError, match="cannot apply a fused activation"):
        acc_kernels()["ConvTranspose"](info, 1)


def test_unet_upsampling_runs_on_cpuacc_and_matches_onnxruntime():
    rng = np.random.default_rng(1)
    weights = [
        helper.make_tensor("w", onnx.TensorProto.FLOAT, (24, 12, 2, 2), rng.standard_normal(24 * 12 * 4)),
        helper.make_tensor("b", onnx.TensorProto.FLOAT, (12,), rng.standard_normal(12)),
    ]
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="up", strides=[2, 2])
    graph = helper.make_graph(
        [node], "decoder", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (1, 24, 14, 14))],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, (1, 12, 28, 28))], weights,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["CpuAcc", "CpuRef"])
    assert opt.assignments() == {"up": "CpuAcc"}
    x = rng.standard_normal((1, 24, 14, 14), dtype=np.float32)
    (y,) = flowrt.InferenceSession(opt).run(None, {"x": x})
    (expected,) = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
