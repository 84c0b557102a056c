"""One CpuAcc kernel against CpuRef's result: the case builders the Conv, depthwise and Gemm
tests share."""

import numpy as np

import flowrt
from flowrt.registry import FusedActivation, WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels

ACTIVATIONS = {
    None: lambda y: y,
    FusedActivation("Relu"): lambda y: np.maximum(y, 0),
    FusedActivation("LeakyRelu", 0.1): lambda y: np.where(y >= 0, y, y * np.float32(0.1)),
    FusedActivation("Clip", -1.0, 2.0): lambda y: np.clip(y, -1, 2),
    FusedActivation("Sigmoid"): lambda y: 1 / (1 + np.exp(-y)),
    FusedActivation("HardSwish"): lambda y: y * np.clip(y / np.float32(6) + np.float32(0.5), 0, 1),
    FusedActivation("HardSigmoid", 0.2, 0.4): lambda y: np.clip(y * np.float32(0.2) + np.float32(0.4), 0, 1),
    FusedActivation("Swish", 0.5): lambda y: y / (1 + np.exp(-y * np.float32(0.5))),
    FusedActivation("Elu", 0.7): lambda y: np.where(y > 0, y, np.float32(0.7) * np.expm1(y)),
    FusedActivation("Gelu"): lambda y: ref_kernels()["Gelu"](flowrt.descriptors.Gelu("none"), y),
}


def run_on_acc(
    kind,
    desc,
    inputs,
    expected,
    constants,
    activation=None,
    *,
    workers=2,
    given_out=False,
    tune=None,
    dtype=np.float32,
    **options,
):
    """CpuAcc's kernel for one ``kind`` layer and its result on ``inputs``, checked for
    ``expected``'s shape and ``dtype`` (and, with ``given_out``, written into the output
    given). ``options`` are passed to the kernel's constructor (Conv's ``tuning``);
    ``tune(kernel)`` may set knobs on it before the run."""
    info = WorkloadInfo(
        kind.lower(), kind, desc, tuple(TensorInfo.of(np.asarray(a)) for a in inputs), (TensorInfo.of(expected),),
        constants, activation,
    )  # fmt: skip
    kernel = acc_kernels()[kind](info, workers, **options)
    if tune:
        tune(kernel)
    fill = np.nan if np.dtype(dtype).kind == "f" else 0
    outputs = [np.full(expected.shape, fill, dtype)] if given_out else None
    (got,) = kernel.execute(list(inputs), outputs)
    if given_out:
        assert got is outputs[0]
    assert got.dtype == dtype and got.shape == expected.shape
    return kernel, got


def conv_case(
    x, w, b=None, *, workers=2, activation=None, constant=True, given_out=False, tuning=None, **attrs
):
    """CpuAcc's and CpuRef's results (CpuRef's followed by the activation) for one conv;
    ``tuning``: the kernel's ``ConvTuning`` (default: its own)."""
    desc = flowrt.descriptors.Conv(**attrs)
    inputs = [x, w] if b is None else [x, w, b]
    expected = ACTIVATIONS[activation](np.asarray(ref_kernels()["Conv"](desc, *inputs)))
    constants = (None, w, b) if constant else (None, None, None)
    options = {} if tuning is None else {"tuning": tuning}
    kernel, got = run_on_acc(
        "Conv", desc, inputs, expected, constants, activation, workers=workers, given_out=given_out, **options
    )
    return kernel, got, expected


def close(got, expected):
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
