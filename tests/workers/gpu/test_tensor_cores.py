"""GpuAcc's GEMM on tensor cores (gemm.cl's MMA build) for half operands. On a device without
them (PoCL's, on CI) the same kernel computes each warp's m16n8k16 product from the fragments
it would hand the tensor cores, so the tiling, the fragment layout and the epilogue are
checked against CpuRef everywhere; on NVIDIA (Ampere and later) the product is PTX's mma.sync."""

import numpy as np
import pytest

import flowrt
from flowrt.registry import FusedActivation
from flowrt.workers.gpu.context import DeviceContext
from flowrt.workers.gpu.kernels import gemm as gemm_module
from flowrt.workers.gpu.kernels.gemm import MMA_TILINGS, TILINGS, TK, GemmPlan


def _normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _assert_close(got, expected):
    scale = float(np.abs(expected).max()) or 1.0
    np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-3 * scale)


@pytest.fixture
def tensor_cores(monkeypatch):
    """Every half GEMM planned on the tensor cores' tilings; yields the tilings planned."""
    monkeypatch.setattr(DeviceContext, "tensor_cores", property(lambda self: True))
    planned = []

    def plan(tiling, splits):
        def forced(shape, batches, units, cpu=False, tilings=TILINGS):
            planned.append(tilings)
            return GemmPlan(tilings[tiling], splits, -(-shape[2] // splits // TK) * TK)

        monkeypatch.setattr(gemm_module, "plan_gemm", forced)
        return planned

    return plan


@pytest.mark.parametrize(("tiling", "splits"), [("64x64", 1), ("128x64", 3), ("32x64", 1), ("128x128", 2)])
def test_half_convolutions_and_products_on_the_tensor_cores_match_cpuref(
    run_half, tensor_cores, tiling, splits
):
    planned = tensor_cores(tiling, splits)
    rng = np.random.default_rng(5)
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
    assert len(planned) == 5 and all(t is MMA_TILINGS for t in planned)


def test_float32_products_stay_off_the_tensor_cores(run_both, tensor_cores):
    planned = tensor_cores("64x64", 1)
    rng = np.random.default_rng(6)
    a, b = _normal(rng, 20, 30), _normal(rng, 30, 10)
    (got,), (expected,) = run_both("MatMul", flowrt.descriptors.MatMul(), [a, b])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert planned == [TILINGS]
