"""Re-batching Gather and GatherND with constant indices: a mask lookup made for batch 1 (as
exported bert, distilbert and llama read their attention mask) and a Gather of positions
along a flattened tensor (torch's as_strided in convnext and swin) give each of N samples
its own elements; where a sample could read another's, the layer is refused with the
reason."""

import numpy as np
import pytest

import flowrt
from flowrt import descriptors as d
from flowrt.engine.graph.passes.batch import set_batch
from flowrt.errors import ShapeError
from flowrt.types import TensorInfo

BATCH = 3
RNG = np.random.default_rng(5)


def _lookup(in_shape, indices, batch_dims=0, perm=None, computed=False, back=True) -> flowrt.Network:
    """x -> [Transpose ``perm``, and back after unless not ``back``] -> GatherND(x, ``indices``)
    -> Mul by 2 -> y; with ``computed`` the indices are Abs of a constant (computed at run time)."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo(in_shape))
    data = net.add_layer("Transpose", d.Transpose(perm=perm), inputs=[x]) if perm else x
    index = net.add_layer("Abs", inputs=[indices]) if computed else indices
    gathered = net.add_layer(
        "GatherND", d.GatherND(batch_dims=batch_dims), inputs=[data, index], name="suspect"
    )
    doubled = net.add_layer("Mul", inputs=[gathered, np.float32(2)])
    moved_back = (
        net.add_layer("Transpose", d.Transpose(perm=perm), inputs=[doubled]) if perm and back else None
    )
    net.add_output("y", moved_back or doubled)
    return net


def _mask_indices(length: int) -> np.ndarray:
    """(1, 1, 1, length, 2): ``[0, j]`` for every position j, as the exporters write it."""
    j = np.arange(length)
    return np.stack([np.zeros_like(j), j], axis=-1).reshape(1, 1, 1, length, 2).astype(np.int64)


async def _per_sample(net: flowrt.Network) -> list[str]:
    """Run ``net`` re-batched to 3 and at batch 1 on each sample on CpuAcc: the rows agree.
    Returns the re-batching lines of the optimizer's report."""
    opt = flowrt.optimize(net, backends=["CpuAcc", "CpuRef"])
    async with flowrt.Runtime() as rt:
        one = await rt.load(opt)
        many = await rt.load(opt, batch=BATCH)
        ((name, info),) = many.inputs.items()
        x = RNG.standard_normal(info.shape).astype(np.float32)
        (got,) = (await many.run({name: x})).values()
        for i in range(BATCH):
            (expected,) = (await one.run({name: x[i : i + 1]})).values()
            np.testing.assert_array_equal(got[i : i + 1], expected)
    return [line for line in set_batch(opt, BATCH).passes if "re-batched" in line]


async def test_a_mask_lookup_reads_each_samples_own_mask():
    lines = await _per_sample(_lookup((1, 6), _mask_indices(6)))
    assert lines == ["re-batched GatherND 'suspect': indices repeated for each of 3 samples"]


async def test_indices_under_batch_dims_are_repeated_for_each_sample():
    indices = np.array([[[2], [0], [3]]], np.int64)  # (1, 3, 1): rows of each sample's (4, 5)
    assert await _per_sample(_lookup((1, 4, 5), indices, batch_dims=1)) == [
        "re-batched GatherND 'suspect': indices repeated for each of 3 samples"
    ]


async def test_a_lookup_that_keeps_the_batch_axis_whole_is_left_as_it_is():
    # (1, 5, 3) -> (5, 1, 3): the batch on axis 1, the indices address axis 0 only
    assert await _per_sample(_lookup((1, 5, 3), np.array([[4], [1]], np.int64), perm=(1, 0, 2))) == []


def _positions(indices: np.ndarray, computed: bool = False) -> flowrt.Network:
    """x (1, 6) -> Reshape [-1]: (6,), the sample's 6 values on the batch axis -> Gather
    ``indices`` along it (Abs of them, computed at run time, with ``computed``) -> y."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 6)))
    flat = net.add_layer("Reshape", inputs=[x, np.array([-1], np.int64)])
    index = net.add_layer("Abs", inputs=[indices]) if computed else indices
    net.add_output("y", net.add_layer("Gather", d.Gather(axis=0), inputs=[flat, index], name="suspect"))
    return net


async def test_positions_gathered_along_a_flattened_sample_are_moved_to_each_samples_values():
    # as torch's as_strided exports: (1, 6, 1) positions, here reversed and one negative
    indices = np.array([5, 4, 3, 2, 1, -6], np.int64).reshape(1, 6, 1)
    assert await _per_sample(_positions(indices)) == [
        "re-batched Gather 'suspect': indices moved to each of 3 samples' rows"
    ]


REFUSED = {
    "gather past the sample": (
        _positions(np.array([[6]], np.int64)),
        r"\(Gather\): its indices reach past the 6 rows of each sample on the batch axis 0",
    ),
    "gather by computed indices": (
        _positions(np.array([[1]], np.int64), computed=True),
        r"\(Gather\): it looks up along the batch axis 0 by indices that are not a constant array",
    ),
    "computed indices": (
        _lookup((1, 6), _mask_indices(6), computed=True),
        "its indices are computed at run time; only constant indices are re-batched",
    ),
    "indices past sample 0": (
        _lookup((1, 6), np.array([[[-1, 2]]], np.int64)),
        "its indices read more than sample 0 of the batch-1 data",
    ),
    "batch addressed off axis 0": (
        _lookup((1, 5, 3), np.array([[4, 0]], np.int64), perm=(1, 0, 2), back=False),
        r"the batch is on axis 1, which its indices \(1, 2\) address",
    ),
}


@pytest.mark.parametrize(("net", "reason"), REFUSED.values(), ids=REFUSED.keys())
def test_a_lookup_that_could_mix_samples_is_refused_with_the_reason(net, reason):
    reason = reason if reason.startswith(r"\(") else r"\(GatherND\): " + reason
    with pytest.raises(ShapeError, match=r"cannot batch layer 'suspect' " + reason):
        set_batch(net, 2)
