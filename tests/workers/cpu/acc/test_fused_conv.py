"""FusedConv on CpuAcc (``act(Conv(X, W, B) + Z)``): the optimizer fuses a residual Add into
the Conv before it; the register tiles start from the residual copied into their output
(``tiles.gemm_panels_onto``), the other algorithms add it after the conv. Against CpuRef."""

import attrs
import numpy as np
import pytest
import trio
from kernelcases import ACTIVATIONS, close, run_on_acc

import flowrt
from flowrt.registry import FusedActivation
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc import tiles
from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
from flowrt.workers.cpu.acc.kernels.epilogue import activation_args
from flowrt.workers.cpu.acc.tile_ir import AVAILABLE as TILES_AVAILABLE
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels

ACTS = [None, FusedActivation("Relu"), FusedActivation("Clip", -1.0, 2.0), FusedActivation("Sigmoid")]


@pytest.mark.skipif(not TILES_AVAILABLE, reason="the register tiles")
@pytest.mark.parametrize("activation", ACTS, ids=lambda a: a.kind if a else "none")
@pytest.mark.parametrize("m, k, n", [(8, 16, 32), (21, 40, 77), (64, 300, 300), (3, 1, 5)])
def test_gemm_panels_onto_adds_the_residual_before_the_activation(m, k, n, activation):
    """On strided views of c and z (their rows padded), blocks of k past DEPTH_MAX, a
    part-filled last panel and spans of columns past RESIDUAL_SPAN_FLOATS // m."""
    rng = np.random.default_rng(m * k + n)
    w = rng.standard_normal((m, k), dtype=np.float32)
    bias = rng.standard_normal(m, dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    z_store = rng.standard_normal((m, n + 7), dtype=np.float32)
    c_store = np.full((m, n + 3), np.nan, np.float32)
    z, c = z_store[:, 2 : n + 2], c_store[:, 1 : n + 1]
    tiles.gemm_panels_onto(tiles.pack_panels(w), tiles.pad_rows(bias), b, c, z, *activation_args(activation))
    expected = ACTIVATIONS[activation]((w.astype(np.float64) @ b + bias[:, None] + z).astype(np.float32))
    np.testing.assert_allclose(c, expected, rtol=1e-4, atol=1e-4)
    assert np.isnan(c_store[:, 0]).all() and np.isnan(c_store[:, n + 1 :]).all()  # nothing outside c


_BY_BLAS = attrs.evolve(ConvTuning(), tiles_max_weights=-1)

# (input shape, weight shape, Conv attributes, tuning, the algorithm it takes, whether that
# adds the residual as its tiles store)
CASES = [
    ((2, 16, 9, 11), (24, 16, 1, 1), {}, None, "packed", True),
    ((1, 64, 20, 20), (40, 64, 1, 1), {}, None, "packed", True),
    ((1, 8, 19, 17), (40, 8, 3, 3), dict(pads=(1, 1, 1, 1)), None, "columns", True),
    ((1, 8, 19, 17), (40, 8, 3, 3), dict(pads=(1, 1, 1, 1)), _BY_BLAS, "columns", False),
    ((1, 8, 19, 17), (12, 8, 3, 3), dict(pads=(1, 1, 1, 1)), None, "taps", False),
    ((1, 32, 28, 28), (32, 32, 3, 3), dict(pads=(1, 1, 1, 1)), None, "winograd", False),
    ((1, 64, 7, 7), (96, 64, 1, 1), {}, None, "few_pixels", False),
    ((1, 4, 8, 8), (6, 2, 3, 3), dict(group=2, pads=(1, 1, 1, 1)), None, "grouped_same3", False),
]


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("activation", ACTS, ids=lambda a: a.kind if a else "none")
@pytest.mark.parametrize("x_shape, w_shape, attrs_, tuning, algorithm, by_tiles", CASES)
def test_fused_conv_adds_z_before_the_activation(x_shape, w_shape, attrs_, tuning, algorithm, by_tiles, activation, workers):  # fmt: skip
    rng = np.random.default_rng(17)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    # outputs near 1 in size: Winograd's rounding is relative to them
    w = rng.standard_normal(w_shape, dtype=np.float32) / np.float32(np.sqrt(np.prod(w_shape[1:])))
    b = rng.standard_normal(w_shape[0], dtype=np.float32)
    desc = flowrt.descriptors.Conv(**attrs_)
    z = rng.standard_normal(np.asarray(ref_kernels()["Conv"](desc, x, w, b)).shape, dtype=np.float32)
    expected = ACTIVATIONS[activation](np.asarray(ref_kernels()["FusedConv"](desc, x, w, b, z)))
    options = {} if tuning is None else {"tuning": tuning}
    kernel, got = run_on_acc(
        "FusedConv", desc, [x, w, b, z], expected, (None, w, b, None), activation, workers=workers,
        given_out=True, **options,
    )  # fmt: skip
    plan = kernel.plan(x_shape, w_shape)
    assert plan.name == algorithm and getattr(plan, "takes_residual", False) is by_tiles
    close(got, expected)


def _bottleneck() -> flowrt.Network:
    """x -> 1x1 Conv + Relu -> 1x1 Conv -> Add x -> Relu: a ResNet bottleneck's end."""
    rng = np.random.default_rng(19)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 32, 12, 12)))
    w1, w2 = (rng.standard_normal((32, 32, 1, 1), dtype=np.float32) * np.float32(0.2) for _ in range(2))
    conv1 = net.add_layer("Conv", flowrt.descriptors.Conv(), [x, w1], name="conv1")
    relu1 = net.add_layer("Relu", inputs=[conv1], name="relu1")
    conv2 = net.add_layer("Conv", flowrt.descriptors.Conv(), [relu1, w2, rng.standard_normal(32, dtype=np.float32)], name="conv2")  # fmt: skip
    add = net.add_layer("Add", inputs=[conv2, x], name="add")
    net.add_output("y", net.add_layer("Relu", inputs=[add], name="relu2"))
    return net


def test_a_residual_add_fuses_into_the_conv_before_it_on_cpuacc():
    x = np.random.default_rng(20).standard_normal((1, 32, 12, 12)).astype(np.float32)
    opt = flowrt.optimize(_bottleneck(), backends=["CpuAcc", "CpuRef"])
    layers = opt.graph.layers
    assert layers["conv2"].kind == "FusedConv" and layers["conv2"].backend == "CpuAcc"
    assert layers["conv2"].activation == FusedActivation("Relu")
    assert "add" not in layers and "relu2" not in layers
    assert "CpuAcc: Conv 'conv2' + Add 'add' + Relu 'relu2'" in opt.report()

    async def run(o):
        async with flowrt.Runtime(cpu_workers=2) as rt:
            return (await (await rt.load(o)).run({"x": x}))["y"]

    expected = trio.run(run, flowrt.optimize(_bottleneck(), backends=["CpuRef"]))
    close(trio.run(run, opt), expected)


def test_a_fused_conv_re_batches_each_sample_with_its_own_residual():
    """A load at batch 3 (what a batching stream makes) runs each sample as batch 1 does: X
    and Z carry the batch on axis 0 (``batch_rules.fused_conv``)."""
    opt = flowrt.optimize(_bottleneck(), backends=["CpuAcc", "CpuRef"])
    assert opt.graph.layers["conv2"].kind == "FusedConv"
    x = np.random.default_rng(21).standard_normal((3, 32, 12, 12)).astype(np.float32)

    async def run():
        async with flowrt.Runtime(cpu_workers=2) as rt:
            one, many = await rt.load(opt), await rt.load(opt, batch=3)
            got = (await many.run({"x": x}))["y"]
            return got, [(await one.run({"x": x[i : i + 1]}))["y"] for i in range(3)]

    got, each = trio.run(run)
    assert got.shape[0] == 3
    for i in range(3):
        close(got[i : i + 1], each[i])
