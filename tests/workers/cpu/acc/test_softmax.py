"""CpuAcc Softmax and LogSoftmax against CpuRef, on every axis and in both opset forms."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import flowrt
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.acc.kernels.softmax import BLOCK, ROWS_BLOCK_FLOATS
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels


def _run_both(kind, x, workers, given_outputs=False, **attributes):
    desc = flowrt.descriptors.Softmax(**attributes)
    expected = np.asarray(ref_kernels()[kind](desc, x))
    info = WorkloadInfo("layer", kind, desc, (TensorInfo.of(x),), (TensorInfo.of(expected),), (None,))
    assert acc_kernels()[kind].supports(info).supported
    kernel = acc_kernels()[kind](info, workers)
    outputs = [np.full_like(expected, np.nan)] if given_outputs else None
    (got,) = kernel.execute([x], outputs)
    if given_outputs:
        assert got is outputs[0]
    assert got.dtype == np.float32 and got.shape == x.shape
    return got, expected


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from(["Softmax", "LogSoftmax"]),
    shape=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    data=st.data(),
    opset=st.sampled_from([11, 13]),
    workers=st.integers(1, 3),
    given_outputs=st.booleans(),
)
def test_softmax_matches_cpuref_on_any_axis(kind, shape, data, opset, workers, given_outputs):
    rank = len(shape)
    axis = data.draw(st.integers(-rank, rank) if opset < 13 else st.integers(-rank, rank - 1))
    x = np.random.default_rng(rank + sum(shape)).uniform(-30, 30, shape).astype(np.float32)
    got, expected = _run_both(kind, x, workers, given_outputs, axis=axis, opset=opset)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_softmax_over_channels_spans_several_column_blocks():
    x = np.random.default_rng(0).standard_normal((2, 21, BLOCK + 37)).astype(np.float32) * 10
    for kind in ("Softmax", "LogSoftmax"):
        got, expected = _run_both(kind, x, 3, axis=1)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_classifier_softmax_of_equal_logits_is_uniform():
    x = np.full((1, 1000), 9.5e9, np.float32)
    got, expected = _run_both("Softmax", x, 2, opset=9)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got, np.float32(0.001))


def test_large_logits_do_not_overflow():
    x = np.array([[1e4, 0, -1e4, 88.8]], np.float32)
    with np.errstate(over="raise", invalid="raise"):
        got, expected = _run_both("Softmax", x, 1)
        log_got, log_expected = _run_both("LogSoftmax", x, 1)
    np.testing.assert_allclose(got, expected, atol=1e-30)
    np.testing.assert_allclose(log_got, log_expected, rtol=1e-6)


def test_non_float32_is_declined_with_a_reason():
    support = flowrt.backend_registry().get("CpuAcc").layer_support()
    x = TensorInfo((2, 3), "float16")
    answer = support.is_layer_supported("LogSoftmax", flowrt.descriptors.Softmax(), [x], [x])
    assert not answer.supported and "float32 only" in answer.reason


def test_an_attention_mask_of_lowest_floats_and_infinities_gives_zeros_where_masked():
    x = np.random.default_rng(3).standard_normal((2, 4, 33, 33), dtype=np.float32)
    causal = np.triu(np.ones((33, 33), bool), 1)
    x[0][:, causal] += np.finfo(np.float32).min  # as torch's exporters write the mask
    x[1][:, causal] = -np.inf
    for kind in ("Softmax", "LogSoftmax"):
        got, expected = _run_both(kind, x, 2, axis=-1)
        np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-7)
        if kind == "Softmax":
            assert (got[:, :, causal] == 0).all()


def test_many_long_rows_run_in_blocks_and_a_nan_spoils_only_its_own_row():
    # rows of 301 run ROWS_BLOCK_FLOATS // 301 at a time: several blocks per slice, the last
    # one short; a NaN makes its row NaN (as numpy's max, exp and sum would), a row of -inf
    # too, and no other row
    x = np.random.default_rng(5).standard_normal((3, 7, 97, 301), dtype=np.float32) * 8
    x[1, 2, 40, 17] = np.nan
    x[2, 6, 96, :] = -np.inf
    assert 97 * 7 * 3 > 3 * (ROWS_BLOCK_FLOATS // 301)
    for kind in ("Softmax", "LogSoftmax"):
        with np.errstate(invalid="ignore"):  # CpuRef's -inf - -inf
            got, expected = _run_both(kind, x, 2)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        assert np.isnan(got[1, 2, 40]).all() and np.isnan(got[2, 6, 96]).all()
        assert np.isnan(got).sum() == 2 * 301
