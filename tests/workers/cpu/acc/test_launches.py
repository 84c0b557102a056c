"""CpuAcc layers whose launches are recorded per memory pool and replayed (launches.py)."""

import numpy as np
import pytest
import trio
from launchcases import (
    checked_runs,
    fork_network,
    network,
    random_input,
    recorded_calls,
    recorded_layers,
    recorded_layers_of,
)
from numba import njit

import flowrt
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc import launches, preload, verdicts
from flowrt.workers.cpu.acc.calls import SliceFunction, run_tasks
from flowrt.workers.cpu.acc.launches import LaunchCall, record


async def test_recorded_layers_replay_what_running_them_gives():
    net = network()
    async with flowrt.Runtime(cpu_workers=2) as rt:
        reference = await rt.load(flowrt.optimize(net, backends=["CpuRef"]))
        model = await rt.load(flowrt.optimize(net, backends=["CpuAcc", "CpuRef"]), max_in_flight=1)
        for seed in range(4):  # the first run runs the layers; the program is made on the second
            got = (await model.run({"x": random_input(seed)}))["y"]
            want = (await reference.run({"x": random_input(seed)}))["y"]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        recorded = recorded_layers(model)
        # the first layer reads the feed, which moves from run to run: it is never recorded
        assert "pointwise" not in recorded and {"three", "strided", "last"} <= set(recorded)
        # convs also keep their launches as a run with one thread (sharing the cores) plans them
        calls = recorded_calls(model.pools.pools[0])
        assert any(c.one_thread is not None and c.one_thread.rows.shape[0] >= 1 for c in calls)
        assert all(c.seconds > 0 for c in calls)  # their work, as their proofs timed it
        # profiled runs run the layers themselves: the same bits
        replayed = (await model.run({"x": random_input(9)}))["y"]
        profiled = (await model.run({"x": random_input(9)}, profile=True))["y"]
        np.testing.assert_array_equal(replayed, profiled)


async def test_a_layer_whose_one_thread_split_cannot_be_recorded_is_not_recorded(monkeypatch):
    # Replaying the lone run's split on one thread (a run sharing the cores) may cost twice the
    # layer's work: where the one-thread split is refused, the layer runs itself, planning
    # for the threads its run has.
    from flowrt.workers.cpu.acc.workload_factory import AccWorkload

    record_split = AccWorkload._record

    def refuse_one(self, split, *args):
        return None if split == "one" else record_split(self, split, *args)

    monkeypatch.setattr(AccWorkload, "_record", refuse_one)
    net = network()
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await checked_runs(rt, net, max_in_flight=1, rounds=4)
        assert model.pools.pools[0].programs  # the program was made
        assert not {"three", "strided", "last"} & set(recorded_layers(model))


def _softmax(net, a, b, w):
    pooled = net.add_layer("GlobalAveragePool", inputs=[b], name="pooled")  # (1, 8, 1, 1)
    return net.add_layer("Softmax", flowrt.descriptors.Softmax(axis=1), [pooled], name="soft")


async def test_a_softmax_of_one_slice_is_recorded():
    # one slice runs straight through its dispatcher, except while launches are recorded
    net = fork_network(3, _softmax)
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await checked_runs(rt, net, max_in_flight=1, rounds=4)
        assert "soft" in recorded_layers(model)


async def test_two_pools_replay_at_once_each_in_its_own_memory():
    net = network()
    async with flowrt.Runtime(cpu_workers=2) as rt:
        await checked_runs(rt, net, max_in_flight=2, rounds=3, at_once=2)


async def test_a_layer_is_proven_once_however_many_pools_record_it(tmp_path, monkeypatch):
    proofs: list[int] = []
    proven = launches.replays_exactly

    def counted(*args):
        proofs.append(1)
        return proven(*args)

    monkeypatch.setattr(launches, "replays_exactly", counted)
    monkeypatch.setattr(preload, "_manifest_dir", lambda: tmp_path / "first")  # verdicts kept here
    net = network()
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await rt.load(flowrt.optimize(net, backends=["CpuAcc", "CpuRef"]), max_in_flight=2)
        for _ in range(3):  # both pools run twice: each records its program
            async with trio.open_nursery() as nursery:
                for seed in range(2):
                    nursery.start_soon(model.run, {"x": random_input(seed)})
        assert all(pool.programs for pool in model.pools.pools)
        first = len(proofs)
        assert first > 0
        recorded = [set(recorded_layers_of(pool)) for pool in model.pools.pools]
        assert recorded[0] == recorded[1] and {"three", "strided", "last"} <= recorded[0]

    async def alone() -> set[str]:
        async with flowrt.Runtime(cpu_workers=2) as rt:
            model = await rt.load(flowrt.optimize(net, backends=["CpuAcc", "CpuRef"]), max_in_flight=1)
            for seed in range(3):
                await model.run({"x": random_input(seed)})
            return set(recorded_layers_of(model.pools.pools[0]))

    # one proof per layer and split: as many as one pool alone makes, with no verdict kept
    monkeypatch.setattr(preload, "_manifest_dir", lambda: tmp_path / "second")
    proofs.clear()
    assert await alone() == recorded[0]
    assert len(proofs) == first
    # a later process takes the verdicts from the file: it proves nothing, records the same
    assert len(list((tmp_path / "second").glob("verdicts-*.pickle"))) == 1
    monkeypatch.setattr(verdicts, "_loaded_from", None)
    monkeypatch.setattr(verdicts, "_known", {})
    proofs.clear()
    assert await alone() == recorded[0]
    assert proofs == []


def _copy_task(task, step, x, out):  # a slice function: out = x + 1
    for i in range(x.size):
        out[i] = x[i] + np.float32(1)


_COPY = SliceFunction(njit(nogil=True)(_copy_task))


def _launching(x_out):
    x, out = x_out
    run_tasks(_COPY.address((x, out)), 1, (x, out))


def test_a_layer_that_works_outside_its_launches_is_not_recorded():
    x, out = np.zeros(16, np.float32), np.zeros(16, np.float32)

    def only_launches(inputs, outputs):
        _launching((inputs[0], outputs[0]))

    def also_numpy(inputs, outputs):
        _launching((inputs[0], outputs[0]))
        outputs[0] *= 2  # not a launch: a replay would leave it out

    def no_launch(inputs, outputs):
        np.add(inputs[0], 1, out=outputs[0])

    call = record(only_launches, [x], [False], [out])
    assert isinstance(call, LaunchCall) and call.rows.shape == (1, 4)
    x[:] = 5
    launches.replay(call.rows)
    np.testing.assert_array_equal(out, np.full(16, 6, np.float32))
    assert record(also_numpy, [x], [False], [out]) is None
    assert record(no_launch, [x], [False], [out]) is None


def test_a_launch_whose_data_do_not_fit_its_record_is_not_recorded(monkeypatch):
    x, out = np.zeros(16, np.float32), np.zeros(16, np.float32)
    monkeypatch.setattr(launches, "RECORD_WORDS", 3)
    assert record(lambda i, o: _launching((i[0], o[0])), [x], [False], [out]) is None


def _scratch_task(task, step, x, out, scratch):  # out = x + 1, through a scratch buffer
    for i in range(x.size):
        scratch[i] = x[i] + np.float32(1)
        out[i] = scratch[i]


_SCRATCH = SliceFunction(njit(nogil=True)(_scratch_task))


@pytest.mark.parametrize("limit, recorded", [(0, False), (1 << 20, True)])
def test_launches_that_would_keep_big_buffers_alive_are_not_recorded(monkeypatch, limit, recorded):
    x, out = np.zeros(16, np.float32), np.zeros(16, np.float32)

    def with_scratch(inputs, outputs):
        args = (inputs[0], outputs[0], np.empty(4096, np.float32))  # a buffer of its own, per call
        run_tasks(_SCRATCH.address(args), 1, args)

    monkeypatch.setattr(launches, "MAX_KEPT_BYTES", limit)
    call = record(with_scratch, [x], [False], [out])
    assert (call is not None) == recorded


def _packed_task(task, step, x, out, packed):  # out = x + packed (a form of a constant)
    for i in range(x.size):
        out[i] = x[i] + packed[i]


_PACKED = SliceFunction(njit(nogil=True)(_packed_task))


def test_read_only_forms_of_constants_do_not_count_as_kept_buffers(monkeypatch):
    # a layer's packed weights are held by the load whether or not its launches are recorded
    x, out = np.zeros(16, np.float32), np.zeros(16, np.float32)
    packed = np.arange(4096, dtype=np.float32)
    packed.flags.writeable = False

    def with_packed(inputs, outputs):
        args = (inputs[0], outputs[0], packed)
        run_tasks(_PACKED.address(args), 1, args)

    monkeypatch.setattr(launches, "MAX_KEPT_BYTES", 0)
    call = record(with_packed, [x], [False], [out])
    assert call is not None
    x[:] = 2
    launches.replay(call.rows)
    np.testing.assert_array_equal(out, 2 + packed[:16])


def test_a_verdict_is_kept_per_layer_shapes_split_and_workers():
    from flowrt.registry import WorkloadInfo

    def info(shape, name="a"):
        return WorkloadInfo(name, "Relu", None, (TensorInfo(shape),), (TensorInfo(shape),))

    one = verdicts.key(info((1, 4)), "every", 2)
    assert one == verdicts.key(info((1, 4), name="b"), "every", 2)  # the layer's name is not in it
    assert len({one, verdicts.key(info((1, 8)), "every", 2), verdicts.key(info((1, 4)), "one", 1)}) == 3
    assert one != verdicts.key(info((1, 4)), "every", 4)


async def test_a_quantized_layer_with_large_packed_weights_is_recorded():
    # 384 x 384 int8 weights (147 KB packed, over MAX_KEPT_BYTES): read-only, so they are not
    # buffers its recording keeps alive
    from qdqmodels import qdq_conv_model

    model_proto = qdq_conv_model(np.random.default_rng(1), channels=384, filters=384, size=4, kernel=1)
    opt = flowrt.optimize(flowrt.onnx.load(model_proto.SerializeToString()), backends=["CpuAcc", "CpuRef"])
    conv = next(layer.name for layer in opt.graph if layer.kind == "QLinearConv")
    xs = [np.random.default_rng(seed).standard_normal((1, 384, 4, 4)).astype(np.float32) for seed in range(2)]
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await rt.load(opt, max_in_flight=1)
        first = [(await model.run({"x": x}))["y"] for x in xs]
        again = [(await model.run({"x": x}))["y"] for x in xs]
        assert conv in recorded_layers_of(model.pools.pools[0])
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("group", "filters"), [(1, 16), (8, 8)])  # a QLinearConv by GEMM; a depthwise one
async def test_quantized_layers_are_recorded_and_replay_what_running_them_gives(group, filters):
    from qdqmodels import qdq_conv_model

    opt = flowrt.optimize(
        flowrt.onnx.load(
            qdq_conv_model(np.random.default_rng(0), filters=filters, group=group).SerializeToString()
        ),
        backends=["CpuAcc", "CpuRef"],
    )
    kinds = {layer.name: layer.kind for layer in opt.graph}
    xs = [np.random.default_rng(seed).standard_normal((1, 8, 10, 10)).astype(np.float32) for seed in range(3)]
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await rt.load(opt, max_in_flight=1)
        first = [(await model.run({"x": x}))["y"] for x in xs]
        again = [(await model.run({"x": x}))["y"] for x in xs]  # bound: replays the recordings
        recorded = {kinds[name] for name in recorded_layers_of(model.pools.pools[0])}
    assert {"QLinearConv", "QLinearMatMul", "DequantizeLinear"} <= recorded  # they take 8-bit inputs
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], first[1])
