"""CpuAcc layers whose launches are recorded per memory pool and replayed (launches.py)."""

import numpy as np
import pytest
import trio
from numba import njit

import flowrt
from flowrt.engine.scheduler.binding import BoundStep
from flowrt.types import TensorInfo
from flowrt.workers.cpu.acc import launches, preload, verdicts
from flowrt.workers.cpu.acc.calls import SliceFunction, run_tasks
from flowrt.workers.cpu.acc.launches import LaunchCall, record


def _net() -> flowrt.Network:
    """Convs of several algorithms (1x1, 3x3, grouped, strided) and a broadcast Add."""
    rng = np.random.default_rng(0)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 8, 20, 20)))
    pad = flowrt.descriptors.Conv(pads=(1, 1, 1, 1))
    a = net.add_layer("Conv", None, [x, w(16, 8, 1, 1), w(16)], name="pointwise")
    b = net.add_layer("Conv", pad, [a, w(16, 16, 3, 3)], name="three")
    c = net.add_layer(
        "Conv",
        flowrt.descriptors.Conv(pads=(1, 1, 1, 1), strides=(2, 2)),
        [b, w(24, 16, 3, 3)],
        name="strided",
    )
    d = net.add_layer("Conv", flowrt.descriptors.Conv(group=2), [c, w(24, 12, 1, 1)], name="grouped")
    e = net.add_layer("Add", inputs=[d, w(24, 1, 1)], name="add")
    net.add_output("y", net.add_layer("Conv", None, [e, w(4, 24, 1, 1)], name="last"))
    return net


def _input(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 8, 20, 20)).astype(np.float32)


def _recorded_layers(model) -> list[str]:
    return _recorded_layers_of(model.pools.pools[0])


def _recorded_steps(pool) -> list[BoundStep]:
    return [
        step
        for steps in pool.programs.values()
        for step in steps
        if type(step) is BoundStep
        and isinstance(getattr(step.call, "keep", None), tuple)  # Launches.compile's
    ]


def _recorded_calls(pool) -> list[LaunchCall]:
    return [
        call for step in _recorded_steps(pool) for call in step.call.keep[0] if isinstance(call, LaunchCall)
    ]


def _recorded_layers_of(pool) -> list[str]:
    return [
        node.layer
        for step in _recorded_steps(pool)
        for node, call in zip(step.nodes, step.call.keep[0])
        if isinstance(call, LaunchCall)
    ]


async def _checked_runs(rt, net: flowrt.Network, max_in_flight: int, rounds: int, at_once: int = 1):
    """``net`` loaded on CpuAcc in ``rt``, run ``rounds`` times ``at_once`` runs in flight, each
    result checked against CpuRef's; the loaded model."""
    reference = await rt.load(flowrt.optimize(net, backends=["CpuRef"]))
    model = await rt.load(flowrt.optimize(net, backends=["CpuAcc", "CpuRef"]), max_in_flight=max_in_flight)
    results: dict[int, np.ndarray] = {}

    async def run(seed: int) -> None:
        results[seed] = (await model.run({"x": _input(seed)}))["y"]

    for round_ in range(rounds):
        async with trio.open_nursery() as nursery:
            for seed in range(round_ * at_once, (round_ + 1) * at_once):
                nursery.start_soon(run, seed)
    for seed, got in results.items():
        want = (await reference.run({"x": _input(seed)}))["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return model


async def test_recorded_layers_replay_what_running_them_gives():
    net = _net()
    async with flowrt.Runtime(cpu_workers=2) as rt:
        reference = await rt.load(flowrt.optimize(net, backends=["CpuRef"]))
        model = await rt.load(flowrt.optimize(net, backends=["CpuAcc", "CpuRef"]), max_in_flight=1)
        for seed in range(4):  # the first run runs the layers; the program is made on the second
            got = (await model.run({"x": _input(seed)}))["y"]
            want = (await reference.run({"x": _input(seed)}))["y"]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        recorded = _recorded_layers(model)
        # the first layer reads the feed, which moves from run to run: it is never recorded
        assert "pointwise" not in recorded and {"three", "strided", "last"} <= set(recorded)
        # convs also keep their launches as a run with one thread (sharing the cores) plans them
        calls = _recorded_calls(model.pools.pools[0])
        assert any(c.one_thread is not None and c.one_thread.rows.shape[0] >= 1 for c in calls)
        assert all(c.seconds > 0 for c in calls)  # their work, as their proofs timed it
        # profiled runs run the layers themselves: the same bits
        replayed = (await model.run({"x": _input(9)}))["y"]
        profiled = (await model.run({"x": _input(9)}, profile=True))["y"]
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
    net = _net()
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await _checked_runs(rt, net, max_in_flight=1, rounds=4)
        assert model.pools.pools[0].programs  # the program was made
        assert not {"three", "strided", "last"} & set(_recorded_layers(model))


async def test_consecutive_recorded_layers_replay_as_one_step():
    net = _net()
    async with flowrt.Runtime(cpu_workers=2) as rt:
        # two runs at once share the cores (one thread each): they replay one-thread launches
        model = await _checked_runs(rt, net, max_in_flight=2, rounds=4, at_once=2)
        # a lone run (every thread) gives the bits of a profiled one, which runs the layers
        replayed = (await model.run({"x": _input(100)}))["y"]
        profiled = (await model.run({"x": _input(100)}, profile=True))["y"]
        np.testing.assert_array_equal(replayed, profiled)
        for pool in model.pools.pools:
            chains = [[node.layer for node in step.nodes] for step in _recorded_steps(pool)]
            # "three" and "strided" follow each other: one step, one replay of both
            assert any(chain[:2] == ["three", "strided"] for chain in chains)
            # and no bound step ends where the next begins: a chain runs as long as its
            # layers are bound (the first reads the feed, and is not)
            for steps in pool.programs.values():
                kinds = [type(step) is BoundStep for step in steps]
                assert not any(a and b for a, b in zip(kinds, kinds[1:]))


async def test_a_chain_stops_between_its_layers_when_its_job_is_signalled(monkeypatch):
    # The chain looks at its job's signal before each layer after the first it runs, and
    # comes back to Python for it (workers.attend), which says whether the job goes on.
    from flowrt.workers.cpu.acc import contention, team

    monkeypatch.setattr(contention, "_next_check", float("inf"))  # the lone run's launches
    before = team.CONTROL[team.CONTENDED]
    team.CONTROL[team.CONTENDED] = 0
    try:
        await _chain_stops(monkeypatch)
    finally:
        team.CONTROL[team.CONTENDED] = before


async def _chain_stops(monkeypatch) -> None:
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await _checked_runs(rt, _net(), max_in_flight=1, rounds=3)
        pool = model.pools.pools[0]
        (step,) = [s for s in _recorded_steps(pool) if [n.layer for n in s.nodes][:2] == ["three", "strided"]]
        calls = step.call.keep[0]
        # the tensor the chain reads, in the pool (the pointwise conv's output): later layers'
        # outputs may take its bytes once it is read
        (outside,) = (
            {t for node in step.nodes for t in node.inputs if t is not None}
            - set(step.outputs)
            - set(model.dataflow.constants)
        )
        read = _pool_tensor(model, pool, outside)
        given = read.copy()

        def outputs_after(run) -> list[np.ndarray]:
            for array in step.outputs.values():
                array.fill(np.nan)
            read[...] = given
            run()
            return [array.copy() for array in step.outputs.values()]

        # what the first layer alone leaves, and what all of them do, replaying their launches
        first_only = outputs_after(lambda: launches.replay(calls[0].rows))
        every = outputs_after(lambda: [launches.replay(call.rows) for call in calls])
        signal = np.ones(1, np.int64)
        looks: list[int] = []

        def attend(goes_on: bool) -> bool:
            looks.append(int(signal[0]))
            signal[0] = 1  # set again at once: the chain comes back before every layer
            return goes_on

        monkeypatch.setattr(launches, "job_signal", lambda: signal)
        for goes_on, expected in ((True, every), (False, first_only)):
            looks.clear()
            monkeypatch.setattr(launches, "attend", lambda goes_on=goes_on: attend(goes_on))
            got = outputs_after(step.call)
            # back in Python before each layer after the first, or stopped there
            assert looks == ([1] * (len(step.nodes) - 1) if goes_on else [1])
            for a, b in zip(got, expected):
                np.testing.assert_array_equal(a, b)
        assert not all(np.array_equal(a, b, equal_nan=True) for a, b in zip(every, first_only))


def _pool_tensor(model, pool, tid: int) -> np.ndarray:
    """The array of tensor ``tid`` in ``pool``: its producer's planned view of it."""
    for node in model.dataflow.order:
        if tid in node.outputs:
            return pool.placements[node.layer][1][list(node.outputs).index(tid)]
    raise AssertionError(f"no layer writes tensor {tid}")


def test_replay_layers_runs_from_a_layer_until_the_signal_is_set():
    # Each "layer" a launch of a task that counts its runs into a cell of its own.
    counts = np.zeros(3, np.int64)
    rows, keep = [], []  # the records the rows point into, and the arguments they borrow
    for layer in range(3):
        with launches.recording() as recorder:
            _COUNT.run(1, (counts[layer:],))
        table, records = recorder.table()
        rows.append(table)
        keep.append((records, recorder.keep))
    table, starts = launches._table(rows)
    assert starts.tolist() == [0, 1, 2, 3]
    unset, set_ = np.zeros(1, np.int64), np.ones(1, np.int64)
    assert launches.replay_layers(table, starts, 0, unset) == 3  # every layer
    assert counts.tolist() == [1, 1, 1]
    assert launches.replay_layers(table, starts, 0, set_) == 1  # the first is always run
    assert counts.tolist() == [2, 1, 1]
    assert launches.replay_layers(table, starts, 1, set_) == 2  # from layer 1
    assert counts.tolist() == [2, 2, 1]
    assert launches.replay_layers(table, starts, 3, set_) == 3  # none left
    assert counts.tolist() == [2, 2, 1]


def _count_task(task, step, cell):  # a slice function: one more run
    cell[0] += 1


_COUNT = SliceFunction(njit(nogil=True)(_count_task))


def _fork(seed: int, join) -> flowrt.Network:
    """x -> a (1x1 conv) -> b (3x3 conv), then ``join(net, a, b, w)``'s layers (``w(*shape)``:
    random weights), whose last is the output y."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 8, 20, 20)))
    a = net.add_layer("Conv", None, [x, w(8, 8, 1, 1)], name="a")
    b = net.add_layer("Conv", flowrt.descriptors.Conv(pads=(1, 1, 1, 1)), [a, w(8, 8, 3, 3)], name="b")
    net.add_output("y", join(net, a, b, w))
    return net


def _residual(net, a, b, w):
    added = net.add_layer("Add", inputs=[a, b], name="residual")  # on the tape: two pool tensors
    c = net.add_layer("Conv", None, [added, w(8, 8, 1, 1)], name="c")
    return net.add_layer("Conv", flowrt.descriptors.Conv(pads=(1, 1, 1, 1)), [c, w(4, 8, 3, 3)])


def _concat(net, a, b, w):
    c = net.add_layer("Conv", None, [a, w(8, 8, 1, 1)], name="c")
    both = net.add_layer("Concat", flowrt.descriptors.Concat(axis=1), [b, c], name="both")
    return net.add_layer("Conv", None, [both, w(4, 16, 1, 1)], name="last")


async def test_a_tapes_run_joins_the_recorded_layers_around_it_in_one_step():
    net = _fork(1, _residual)
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await _checked_runs(rt, net, max_in_flight=1, rounds=4)
        chains = [[node.layer for node in step.nodes] for step in _recorded_steps(model.pools.pools[0])]
        (with_add,) = [chain for chain in chains if "residual" in chain]
        assert {"b", "residual", "c"} <= set(with_add)
        assert "residual" not in _recorded_layers(model)  # a tape's call, not a recorded layer


async def test_a_concat_whose_inputs_are_written_in_place_is_bound_to_nothing():
    net = _fork(2, _concat)
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await _checked_runs(rt, net, max_in_flight=1, rounds=4)
        steps = [step for steps in model.pools.pools[0].programs.values() for step in steps]
        # b and c write their bands of the Concat's output: the Concat has nothing to copy and
        # is no step of its own, nor a recorded layer
        assert all(type(step) is BoundStep for step in steps if getattr(step, "layer", None) == "both")
        assert any("both" in [n.layer for n in step.nodes] for step in steps if type(step) is BoundStep)
        assert "both" not in _recorded_layers(model)


def _softmax(net, a, b, w):
    pooled = net.add_layer("GlobalAveragePool", inputs=[b], name="pooled")  # (1, 8, 1, 1)
    return net.add_layer("Softmax", flowrt.descriptors.Softmax(axis=1), [pooled], name="soft")


async def test_a_softmax_of_one_slice_is_recorded():
    # one slice runs straight through its dispatcher, except while launches are recorded
    net = _fork(3, _softmax)
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await _checked_runs(rt, net, max_in_flight=1, rounds=4)
        assert "soft" in _recorded_layers(model)


async def test_two_pools_replay_at_once_each_in_its_own_memory():
    net = _net()
    async with flowrt.Runtime(cpu_workers=2) as rt:
        await _checked_runs(rt, net, max_in_flight=2, rounds=3, at_once=2)


async def test_a_layer_is_proven_once_however_many_pools_record_it(tmp_path, monkeypatch):
    proofs: list[int] = []
    proven = launches.replays_exactly

    def counted(*args):
        proofs.append(1)
        return proven(*args)

    monkeypatch.setattr(launches, "replays_exactly", counted)
    monkeypatch.setattr(preload, "_manifest_dir", lambda: tmp_path / "first")  # verdicts kept here
    net = _net()
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await rt.load(flowrt.optimize(net, backends=["CpuAcc", "CpuRef"]), max_in_flight=2)
        for _ in range(3):  # both pools run twice: each records its program
            async with trio.open_nursery() as nursery:
                for seed in range(2):
                    nursery.start_soon(model.run, {"x": _input(seed)})
        assert all(pool.programs for pool in model.pools.pools)
        first = len(proofs)
        assert first > 0
        recorded = [set(_recorded_layers_of(pool)) for pool in model.pools.pools]
        assert recorded[0] == recorded[1] and {"three", "strided", "last"} <= recorded[0]

    async def alone() -> set[str]:
        async with flowrt.Runtime(cpu_workers=2) as rt:
            model = await rt.load(flowrt.optimize(net, backends=["CpuAcc", "CpuRef"]), max_in_flight=1)
            for seed in range(3):
                await model.run({"x": _input(seed)})
            return set(_recorded_layers_of(model.pools.pools[0]))

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
        assert conv in _recorded_layers_of(model.pools.pools[0])
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
        recorded = {kinds[name] for name in _recorded_layers_of(model.pools.pools[0])}
    assert {"QLinearConv", "QLinearMatMul", "DequantizeLinear"} <= recorded  # they take 8-bit inputs
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], first[1])


@pytest.mark.parametrize(
    ("split_s", "contended", "replays"),
    [(1.0, 1, "one thread's"), (0.0, 1, "every thread's"), (1.0, 0, "every thread's")],
)
async def test_while_the_cores_are_shared_short_layers_replay_as_one_thread_plans_them(
    monkeypatch, split_s, contended, replays
):
    # Beside a busy process (team.CONTENDED), a layer whose work is under CONTENDED_SPLIT_S
    # replays its launches as a run of one thread made them: no region, no helper to wake.
    from flowrt.workers.cpu.acc import contention, team

    monkeypatch.setattr(launches, "CONTENDED_SPLIT_S", split_s)
    monkeypatch.setattr(contention, "_next_check", float("inf"))  # no look changes the state
    replayed: list[np.ndarray] = []
    real = launches.replay_layers
    before = team.CONTROL[team.CONTENDED]
    team.CONTROL[team.CONTENDED] = contended
    try:
        async with flowrt.Runtime(cpu_workers=2) as rt:
            model = await _checked_runs(rt, _net(), max_in_flight=1, rounds=4)
            split = [c for c in _recorded_calls(model.pools.pools[0]) if c.one_thread is not None]
            assert split and team.CONTROL[team.CONTENDED] == contended
            monkeypatch.setattr(
                launches,
                "replay_layers",
                lambda rows, starts, at, signal: (
                    replayed.append(rows.copy()) or real(rows, starts, at, signal)
                ),
            )
            await model.run({"x": _input(0)})
    finally:
        team.CONTROL[team.CONTENDED] = before
    rows = {tuple(row) for table in replayed for row in table}
    for call in split:
        one = {tuple(row) for row in call.one_thread.rows}
        every = {tuple(row) for row in call.rows}
        assert (one <= rows, every <= rows) == ((True, False) if replays == "one thread's" else (False, True))
