"""CpuAcc's recorded layers replayed as chains: consecutive ones in one native call
(``launches.replay_layers``) that comes back to Python only when its job is signalled, and
the rows each run replays (lone, one thread, beside a busy process)."""

import numpy as np
import pytest
from launchcases import (
    checked_runs,
    fork_network,
    network,
    random_input,
    recorded_calls,
    recorded_layers,
    recorded_steps,
)
from numba import njit

import flowrt
from flowrt.engine.scheduler.binding import BoundStep
from flowrt.workers.cpu.acc import launches
from flowrt.workers.cpu.acc.calls import SliceFunction


async def test_consecutive_recorded_layers_replay_as_one_step():
    net = network()
    async with flowrt.Runtime(cpu_workers=2) as rt:
        # two runs at once share the cores (one thread each): they replay one-thread launches
        model = await checked_runs(rt, net, max_in_flight=2, rounds=4, at_once=2)
        # a lone run (every thread) gives the bits of a profiled one, which runs the layers
        replayed = (await model.run({"x": random_input(100)}))["y"]
        profiled = (await model.run({"x": random_input(100)}, profile=True))["y"]
        np.testing.assert_array_equal(replayed, profiled)
        for pool in model.pools.pools:
            chains = [[node.layer for node in step.nodes] for step in recorded_steps(pool)]
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
        model = await checked_runs(rt, network(), max_in_flight=1, rounds=3)
        pool = model.pools.pools[0]
        (step,) = [s for s in recorded_steps(pool) if [n.layer for n in s.nodes][:2] == ["three", "strided"]]
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


def _residual(net, a, b, w):
    # on the tape: two pool tensors (a Sub: an Add of a conv's output would fuse into the conv)
    added = net.add_layer("Sub", inputs=[a, b], name="residual")
    c = net.add_layer("Conv", None, [added, w(8, 8, 1, 1)], name="c")
    return net.add_layer("Conv", flowrt.descriptors.Conv(pads=(1, 1, 1, 1)), [c, w(4, 8, 3, 3)])


def _concat(net, a, b, w):
    c = net.add_layer("Conv", None, [a, w(8, 8, 1, 1)], name="c")
    both = net.add_layer("Concat", flowrt.descriptors.Concat(axis=1), [b, c], name="both")
    return net.add_layer("Conv", None, [both, w(4, 16, 1, 1)], name="last")


async def test_a_tapes_run_joins_the_recorded_layers_around_it_in_one_step():
    net = fork_network(1, _residual)
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await checked_runs(rt, net, max_in_flight=1, rounds=4)
        chains = [[node.layer for node in step.nodes] for step in recorded_steps(model.pools.pools[0])]
        (with_add,) = [chain for chain in chains if "residual" in chain]
        assert {"b", "residual", "c"} <= set(with_add)
        assert "residual" not in recorded_layers(model)  # a tape's call, not a recorded layer


async def test_a_concat_whose_inputs_are_written_in_place_is_bound_to_nothing():
    net = fork_network(2, _concat)
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await checked_runs(rt, net, max_in_flight=1, rounds=4)
        steps = [step for steps in model.pools.pools[0].programs.values() for step in steps]
        # b and c write their bands of the Concat's output: the Concat has nothing to copy and
        # is no step of its own, nor a recorded layer
        assert all(type(step) is BoundStep for step in steps if getattr(step, "layer", None) == "both")
        assert any("both" in [n.layer for n in step.nodes] for step in steps if type(step) is BoundStep)
        assert "both" not in recorded_layers(model)


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
            model = await checked_runs(rt, network(), max_in_flight=1, rounds=4)
            split = [c for c in recorded_calls(model.pools.pools[0]) if c.one_thread is not None]
            assert split and team.CONTROL[team.CONTENDED] == contended
            monkeypatch.setattr(
                launches,
                "replay_layers",
                lambda rows, starts, at, signal: (
                    replayed.append(rows.copy()) or real(rows, starts, at, signal)
                ),
            )
            await model.run({"x": random_input(0)})
    finally:
        team.CONTROL[team.CONTENDED] = before
    rows = {tuple(row) for table in replayed for row in table}
    for call in split:
        one = {tuple(row) for row in call.one_thread.rows}
        every = {tuple(row) for row in call.rows}
        assert (one <= rows, every <= rows) == ((True, False) if replays == "one thread's" else (False, True))
