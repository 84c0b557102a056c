"""GpuAcc's half-precision storage: with ``reduce_fp32_to_fp16`` the layers whose kernels take
float16 keep their tensors and weights as half on the device (vload_half / vstore_half_rte),
computing in float (the GEMMs on tensor cores where the device has them); Casts on GpuAcc at
their borders. Checked layer by layer against CpuRef on the same half-rounded values, and
through the public API on a whole CNN."""

import numpy as np
import pytest
import trio

import flowrt
from flowrt.registry import FusedActivation, WorkloadInfo
from flowrt.types import DataType, TensorInfo
from flowrt.workers.gpu.context import DeviceContext
from flowrt.workers.gpu.kernels.gemm import MMA_TILINGS, TILINGS
from flowrt.workers.gpu.layer_support import GpuLayerSupport
from flowrt.workers.gpu.workload_factory import GpuWorkloadFactory

F16 = np.float16


def _normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _assert_close(got, expected):
    """Within half's rounding of the result (and of float sums in another order)."""
    scale = float(np.abs(expected).max()) or 1.0
    np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-3 * scale)


@pytest.mark.parametrize(
    ("tensor_cores", "tiling", "splits"),
    [(False, "64x64", 1), (False, "64x64", 3), (True, "64x64", 1), (True, "128x64", 3), (True, "32x64", 1),
     (True, "128x128", 2)],
)  # fmt: skip
def test_half_convolutions_and_products_match_cpuref_on_float_units_and_tensor_cores(
    run_half, force_gemm_plan, monkeypatch, tensor_cores, tiling, splits
):
    """Conv, Gemm and MatMul stored as half, on each tiling of the float units' build and
    of the tensor cores' (gemm.cl's MMA build: on a device without them, PoCL's on CI, each
    warp's m16n8k16 product is computed from the fragments it would hand the tensor cores, so
    their layout is checked everywhere), K whole or split (the partial sums stay float)."""
    if tensor_cores:
        monkeypatch.setattr(DeviceContext, "tensor_cores", property(lambda self: True))
    planned = force_gemm_plan(tiling, splits)
    rng = np.random.default_rng(3)
    # a grouped 3x3 convolution (implicit GEMM) with bias, residual and ReLU; no tile divides it
    x, w, b = _normal(rng, 2, 40, 9, 11), _normal(rng, 70, 20, 3, 3) * 0.2, _normal(rng, 70)
    residual = _normal(rng, 2, 70, 9, 11)
    (got,), (expected,) = run_half(
        "FusedConv", flowrt.descriptors.Conv(group=2, pads=(1, 1, 1, 1)), [x, w, b, residual], constant=(1, 2),
        activation=FusedActivation("Relu"),
    )  # fmt: skip
    _assert_close(got, np.maximum(expected, 0))
    # a strided 7x7 window, and a 1x1 convolution read as a plain GEMM over the image
    x = _normal(rng, 1, 3, 20, 20)
    (got,), (expected,) = run_half(
        "Conv", flowrt.descriptors.Conv(strides=(2, 2), pads=(3, 3, 3, 3)), [x, _normal(rng, 24, 3, 7, 7) * 0.2],
        constant=(1,),
    )  # fmt: skip
    _assert_close(got, expected)
    x = _normal(rng, 2, 48, 6, 7)
    (got,), (expected,) = run_half(
        "Conv", flowrt.descriptors.Conv(), [x, _normal(rng, 33, 48, 1, 1) * 0.2], constant=(1,)
    )
    _assert_close(got, expected)
    # transposed operands, alpha and beta; a batched MatMul
    a, bt, c = _normal(rng, 100, 37), _normal(rng, 75, 100) * 0.1, _normal(rng, 37, 75)
    (got,), (expected,) = run_half(
        "Gemm", flowrt.descriptors.Gemm(transA=1, transB=1, alpha=0.5, beta=2.0), [a, bt, c], constant=(1, 2)
    )
    _assert_close(got, expected)
    (got,), (expected,) = run_half(
        "MatMul", flowrt.descriptors.MatMul(), [_normal(rng, 3, 33, 64), _normal(rng, 64, 20)]
    )
    _assert_close(got, expected)
    assert len(planned) == 5 and all(t is (MMA_TILINGS if tensor_cores else TILINGS) for t in planned)


def test_float32_products_stay_off_the_tensor_cores(run_both, force_gemm_plan, monkeypatch):
    monkeypatch.setattr(DeviceContext, "tensor_cores", property(lambda self: True))
    planned = force_gemm_plan("64x64", 1)
    rng = np.random.default_rng(6)
    a, b = _normal(rng, 20, 30), _normal(rng, 30, 10)
    (got,), (expected,) = run_both("MatMul", flowrt.descriptors.MatMul(), [a, b])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert planned == [TILINGS]


def test_pooling_elementwise_and_layout_kernels_store_half(run_half):
    rng = np.random.default_rng(4)
    x = _normal(rng, 2, 6, 9, 9)
    cases = [
        ("MaxPool", flowrt.descriptors.MaxPool(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)), [x]),
        ("AveragePool", flowrt.descriptors.AveragePool(kernel_shape=(2, 2), strides=(2, 2)), [x]),
        ("GlobalAveragePool", None, [x]),
        ("Relu", None, [x]),
        ("Sigmoid", None, [x]),
        ("Exp", None, [x * 0.5]),
        ("Add", None, [x, _normal(rng, 6, 1, 1)]),
        ("Sum", None, [x, x * 2, _normal(rng, 9)]),
        ("Concat", flowrt.descriptors.Concat(axis=1), [x, _normal(rng, 2, 3, 9, 9)]),
        ("Transpose", flowrt.descriptors.Transpose(perm=(0, 2, 3, 1)), [x]),
        ("Softmax", flowrt.descriptors.Softmax(axis=-1), [x * 3]),
        ("Softmax", flowrt.descriptors.Softmax(axis=1), [x * 3]),
        ("LayerNormalization", flowrt.descriptors.LayerNormalization(axis=-1), [x, *_normal(rng, 2, 9)]),
        (
            "BatchNormalization",
            flowrt.descriptors.BatchNormalization(),
            [x, *_normal(rng, 3, 6), _normal(rng, 6) ** 2 + 0.5],
        ),
    ]
    for kind, desc, inputs in cases:
        outputs, expected = run_half(kind, desc, inputs)
        for got, want in zip(outputs, expected):
            _assert_close(got, want)


def test_a_cast_rounds_to_the_nearest_half_as_numpy_does_and_back_exactly(gpu):
    """Float32 to float16 (ties to even, overflow to infinity, subnormals) and float16 to
    float32 (exact), as numpy's astype."""
    factory = GpuWorkloadFactory(None, gpu)
    cast = flowrt.descriptors.Cast(to=10)
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            _normal(rng, 200) * 100,
            np.float32([65504, 65520, 1e5, -1e5, 6e-8, 3e-8, 1e-9, 0.0, -0.0]),
            np.float32([1 + 2**-11, 1 + 3 * 2**-11, 2049, 2051]),  # ties: to even
        ]
    )
    to_half = factory.create_workload(
        WorkloadInfo("to_half", "Cast", cast, (TensorInfo.of(x),), (TensorInfo(x.shape, DataType.FLOAT16),))
    )
    to_half.prepare()
    (half,) = to_half.execute([x])
    with np.errstate(over="ignore"):  # past half's range: infinity, as the kernel gives
        rounded = x.astype(F16)
    np.testing.assert_array_equal(half.get(), rounded)  # bit for bit, infinities included
    back = factory.create_workload(
        WorkloadInfo(
            "to_float", "Cast", flowrt.descriptors.Cast(to=1), (TensorInfo(x.shape, DataType.FLOAT16),),
            (TensorInfo.of(x),),
        )
    )  # fmt: skip
    back.prepare()
    (full,) = back.execute([half])
    np.testing.assert_array_equal(full.get(), rounded.astype(np.float32))


def test_gpuacc_takes_no_cast_it_cannot_do_and_no_float16_layer_its_kernel_does_not_store():
    support = GpuLayerSupport()
    ints = TensorInfo((4,), DataType.INT64)
    floats = TensorInfo((4,), DataType.FLOAT32)
    answer = support.is_layer_supported("Cast", flowrt.descriptors.Cast(to=1), [ints], [floats])
    assert not answer.supported and "GpuAcc runs float32 and float16 (stored as half) only" in answer.reason
    images = TensorInfo((1, 4, 2, 2), DataType.FLOAT16)
    answer = support.is_layer_supported("LRN", flowrt.descriptors.LRN(size=3), [images], [images])
    assert not answer.supported and "GpuAcc runs float32 only; input 0 is float16" in answer.reason


def test_a_cnn_reduced_to_float16_runs_its_layers_and_casts_on_gpuacc_close_to_cpuref(gpu, conv_network):
    """Through the public API: every layer converted (each has a half kernel) and on GpuAcc,
    the Casts at the borders on GpuAcc too, half the activation bytes of the float32 plan, and
    outputs within 1e-2 of CpuRef's, not equal to float32's (the rounding shows)."""
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)

    async def run(backends, reduce):
        opt = flowrt.optimize(
            conv_network(), backends=backends, options=flowrt.OptimizerOptions(reduce_fp32_to_fp16=reduce)
        )
        async with flowrt.Runtime(cpu_workers=1) as rt:
            model = await rt.load(opt)
            for _ in range(3):  # the first runs, the recording one, then recorded launches
                out = await model.run({"x": x})
            return opt, out["y"], model.memory_report().get("GpuAcc", {})

    _, want, _ = trio.run(run, ["CpuRef"], False)
    _, full, full_memory = trio.run(run, ["GpuAcc", "CpuRef"], False)
    opt, half, half_memory = trio.run(run, ["GpuAcc", "CpuRef"], True)
    reduced = {p.split("'")[1] for p in opt.passes if p.startswith("reduced ")}
    assert reduced == {
        "conv1",
        "MaxPool",
        "conv2",
        "concat",
        "GlobalAveragePool",
        "Flatten",
        "gemm",
        "softmax",
    }
    layers = {layer.name: layer for layer in opt.graph}
    assert all(layers[name].backend == "GpuAcc" for name in reduced)
    casts = [layer for layer in opt.graph if layer.kind == "Cast"]
    assert len(casts) == 2 and all(c.backend == "GpuAcc" for c in casts)  # in, and out to the output
    assert layers["softmax"].outputs[0].info.dtype is DataType.FLOAT16
    assert half.dtype == np.float32
    np.testing.assert_allclose(full, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(half, want, rtol=0, atol=1e-2 * np.abs(want).max())
    assert not np.array_equal(half, full)
    assert half_memory["arena_bytes"] < full_memory["arena_bytes"]
