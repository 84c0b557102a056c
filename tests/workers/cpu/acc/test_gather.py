"""CpuAcc Gather against CpuRef: any axis, int32/int64 and negative indices, scalar indices,
constant or computed indices, planned outputs; an embedding lookup in a network."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowrt
from flowrt.errors import ShapeError
from flowrt.registry import WorkloadInfo
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc.kernels import load_all as acc_kernels
from flowrt.workers.cpu.ref.kernels import load_all as ref_kernels


def _kernel(x, indices, axis, workers=2, constant=True):
    desc = flowrt.descriptors.Gather(axis=axis)
    expected = ref_kernels()["Gather"](desc, x, indices)
    info = WorkloadInfo(
        "layer", "Gather", desc, (TensorInfo.of(x), TensorInfo.of(indices)), (TensorInfo.of(expected),),
        (None, indices if constant else None),
    )  # fmt: skip
    return acc_kernels()["Gather"](info, workers), expected


@st.composite
def gather_case(draw):
    dtype = draw(st.sampled_from([np.float32, np.float32, np.int64]))
    x = draw(hnp.arrays(dtype, hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6)))
    axis = draw(st.integers(-x.ndim, x.ndim - 1))
    dim = x.shape[axis]
    index_shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=4))
    index_type = draw(st.sampled_from([np.int32, np.int64]))
    indices = draw(hnp.arrays(index_type, index_shape, elements=st.integers(-dim, dim - 1)))
    return x, indices, axis


@settings(max_examples=25, deadline=None)
@given(case=gather_case(), workers=st.integers(1, 3), constant=st.booleans(), given_outputs=st.booleans())
def test_gather_matches_cpuref(case, workers, constant, given_outputs):
    x, indices, axis = case
    kernel, expected = _kernel(x, indices, axis, workers, constant)
    outputs = [np.empty(expected.shape, expected.dtype)] if given_outputs else None
    (got,) = kernel.execute([x, indices], outputs)
    if given_outputs:
        assert got is outputs[0]
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("constant", [True, False])
def test_index_out_of_range_is_refused(constant):
    x = np.zeros((3, 4), np.float32)
    indices = np.array([0, -4], np.int64)
    infos = (TensorInfo.of(x), TensorInfo.of(indices))
    info = WorkloadInfo(
        "layer", "Gather", flowrt.descriptors.Gather(), infos, (TensorInfo((2, 4)),),
        (None, indices if constant else None),
    )  # fmt: skip
    with pytest.raises(ShapeError, match=r"indices in \[-3, 3\) expected, got -4"):
        acc_kernels()["Gather"](info, 1).execute([x, indices])


def test_large_lookup_spreads_over_workers():
    rng = np.random.default_rng(0)
    table = rng.standard_normal((500, 256), dtype=np.float32)
    ids = rng.integers(-500, 500, (4, 100))
    kernel, expected = _kernel(table, ids, 0, workers=3, constant=False)
    (got,) = kernel.execute([table, ids])
    np.testing.assert_array_equal(got, expected)
    columns = np.array([255, 0, -1])
    kernel, expected = _kernel(table, columns, 1, workers=3)  # one element a row
    (got,) = kernel.execute([table, columns])
    np.testing.assert_array_equal(got, expected)


def test_embedding_lookup_with_a_constant_table_runs_on_cpuacc():
    table = np.random.default_rng(1).standard_normal((50, 16), dtype=np.float32)
    net = flowrt.Network()
    ids = net.add_input("ids", TensorInfo((2, 5), "int64"))
    lookup = net.add_layer("Gather", inputs=[table, ids], name="embed")
    last = net.add_layer("Gather", flowrt.descriptors.Gather(axis=1), [lookup, np.array(-1)], name="last")
    net.add_output("y", last)
    opt = flowrt.optimize(net, backends=["CpuAcc", "CpuRef"])
    assert opt.assignments() == {"embed": "CpuAcc", "last": "CpuAcc"}
    tokens = np.array([[0, 49, 3, -1, 7], [10, 11, 12, -50, 0]], np.int64)
    (y,) = flowrt.InferenceSession(opt).run(None, {"ids": tokens})
    np.testing.assert_array_equal(y, table[tokens][:, -1])
