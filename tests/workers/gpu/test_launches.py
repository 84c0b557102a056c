"""A memory pool's GPU launches are recorded on its second run of a segment and later runs
enqueue them as they are (``flowrt.workers.gpu.launches``): same results as CpuRef in every
run, fewer launches through the kernels' Python, and nothing recorded that could change."""

import gc
import re

import numpy as np
import onnx
import pytest
import trio

import flowrt
from flowrt.types import TensorInfo
from flowrt.workers.gpu import launches
from flowrt.workers.gpu.scratch import ScratchSets, current_scratch
from flowrt.workers.gpu.typed_kernel import TypedKernel


@pytest.fixture
def launch_counts(monkeypatch):
    """Launches made through a kernel's ``enqueue`` ("python") and replayed ("bound")."""
    counts = {"python": 0, "bound": 0}
    call, enqueue_range = TypedKernel.__call__, launches.BoundLaunches.enqueue_range

    def counting_call(self, *args, **kwargs):
        counts["python"] += 1
        return call(self, *args, **kwargs)

    def counting_enqueue_range(self, queue, start, stop):
        enqueue_range(self, queue, start, stop)
        counts["bound"] += stop - start

    monkeypatch.setattr(TypedKernel, "__call__", counting_call)
    monkeypatch.setattr(launches.BoundLaunches, "enqueue_range", counting_enqueue_range)
    return counts


def _random_feeds(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)}


async def _references(network, feeds_list):
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(flowrt.optimize(network, backends=["CpuRef"]))
        return [await model.run(feeds) for feeds in feeds_list]


async def _conv_case(conv_network, runs: int):
    """``runs`` random feeds of the conv network, CpuRef's outputs for them, and the network
    optimized for GpuAcc."""
    feeds = [_random_feeds(seed) for seed in range(runs)]
    optimized = flowrt.optimize(conv_network(), backends=["GpuAcc", "CpuRef"])
    return feeds, await _references(conv_network(), feeds), optimized


async def _run_each_and_compare(opt, feeds, expected) -> None:
    """Run ``opt`` on each feed in turn in one pool, checking each output against CpuRef's."""
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt, max_in_flight=1)
        for feed, want in zip(feeds, expected):
            out = await model.run(feed)
            np.testing.assert_allclose(out["y"], want["y"], rtol=1e-5, atol=1e-6)


async def test_later_runs_in_a_pool_enqueue_its_recorded_launches_with_cpurefs_results(
    gpu, conv_network, launch_counts
):
    feeds, expected, opt = await _conv_case(conv_network, 5)
    per_run = []
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt, max_in_flight=1)
        for i, (feed, want) in enumerate(zip(feeds, expected)):
            launch_counts.update(python=0, bound=0)
            priority = flowrt.Priority.HIGH if i % 2 else flowrt.Priority.LOW  # queues change too
            out = await model.run(feed, priority=priority)
            np.testing.assert_allclose(out["y"], want["y"], rtol=1e-5, atol=1e-6)
            per_run.append(dict(launch_counts))
    total = per_run[0]["python"]
    assert [r["bound"] for r in per_run[:2]] == [0, 0]  # the first runs, then the recording one
    assert per_run[1]["python"] == total
    for later in per_run[2:]:
        assert later["python"] + later["bound"] == total  # the same launches...
        assert later["bound"] > later["python"]  # ...most of them recorded


def _view_network() -> flowrt.Network:
    """Conv, then a Reshape (a view: no bytes, no launch), a Transpose and a MatMul that read
    the view's bytes, all on GpuAcc."""
    rng = np.random.default_rng(2)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 3, 8, 8)))
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    conv = net.add_layer("Conv", flowrt.descriptors.Conv(pads=(1, 1, 1, 1)), [x, w], name="conv")
    flat = net.add_layer("Reshape", inputs=[conv, np.array([1, 4, 64], np.int64)], name="reshape")
    turned = net.add_layer(
        "Transpose", flowrt.descriptors.Transpose(perm=(0, 2, 1)), [flat], name="transpose"
    )
    m = rng.standard_normal((4, 5)).astype(np.float32)
    net.add_output("y", net.add_layer("MatMul", inputs=[turned, m], name="matmul"))
    return net


async def test_layers_reading_a_view_of_pool_memory_are_recorded_too(gpu, launch_counts):
    from flowrt.engine.scheduler.device_segments import BoundGroup

    """A Reshape's output is its input's planned bytes, the same in every run: the Transpose
    and MatMul after it replay their launches; only the Conv reading the feed does not."""
    feeds = [
        {"x": np.random.default_rng(seed).standard_normal((1, 3, 8, 8)).astype(np.float32)}
        for seed in range(5)
    ]
    expected = await _references(_view_network(), feeds)
    opt = flowrt.optimize(_view_network(), backends=["GpuAcc", "CpuRef"])
    assert {opt.assignments()[name] for name in ("conv", "reshape", "transpose", "matmul")} == {"GpuAcc"}
    per_run = []
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt, max_in_flight=1)
        for feed, want in zip(feeds, expected):
            launch_counts.update(python=0, bound=0)
            out = await model.run(feed)
            np.testing.assert_allclose(out["y"], want["y"], rtol=1e-5, atol=1e-5)
            per_run.append(dict(launch_counts))
        programs = model.pools.pools[0].programs
        (program,) = [v for k, v in programs.items() if isinstance(k, tuple) and k[0] == "device program"]
    # the Reshape runs no code of its own: its tensor is published with the recorded group
    steps = [
        [n.layer for n in step.nodes] if isinstance(step, BoundGroup) else step.layer for step in program
    ]
    assert steps == ["conv", ["reshape", "transpose", "matmul"]]
    conv_launches = per_run[-1]["python"]
    assert conv_launches >= 1
    for later in per_run[2:]:
        assert later["bound"] >= 2  # the Transpose's and the MatMul's
        assert later["python"] == conv_launches


async def test_runs_in_flight_in_several_pools_each_enqueue_their_own_launches(
    gpu, conv_network, launch_counts
):
    feeds, expected, opt = await _conv_case(conv_network, 4)
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt, max_in_flight=2)
        results: dict[int, dict] = {}

        async def run(i):
            results[i] = await model.run(feeds[i])

        for _ in range(4):
            results.clear()
            async with trio.open_nursery() as nursery:
                for i in range(len(feeds)):
                    nursery.start_soon(run, i)
            for i, want in enumerate(expected):
                np.testing.assert_allclose(results[i]["y"], want["y"], rtol=1e-5, atol=1e-6)
        programs = [p.programs for p in model.pools.pools]
    assert launch_counts["bound"] > 0
    assert all(any(key[0] == "device" for key in p) for p in programs)  # each pool recorded its own


def _copy_network() -> flowrt.Network:
    """Conv, a Sum of one input (GpuAcc copies it), Conv: the copy is no launch."""
    rng = np.random.default_rng(1)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 3, 16, 16)))
    w1 = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    conv1 = net.add_layer("Conv", flowrt.descriptors.Conv(pads=(1, 1, 1, 1)), [x, w1], name="conv1")
    copied = net.add_layer("Sum", inputs=[conv1], name="copied")
    w2 = rng.standard_normal((4, 4, 1, 1)).astype(np.float32)
    net.add_output("y", net.add_layer("Conv", flowrt.descriptors.Conv(), [copied, w2], name="conv2"))
    return net


async def test_a_layer_that_enqueues_anything_but_launches_is_not_recorded(gpu, launch_counts):
    feeds = [_random_feeds(seed) for seed in range(4)]
    expected = await _references(_copy_network(), feeds)
    opt = flowrt.optimize(_copy_network(), backends=["GpuAcc", "CpuRef"])
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt, max_in_flight=1)
        for feed, want in zip(feeds, expected):
            out = await model.run(feed)
            scale = float(np.abs(want["y"]).max())
            np.testing.assert_allclose(out["y"], want["y"], rtol=1e-5, atol=1e-6 * scale)
        (recorded,) = [v for k, v in model.pools.pools[0].programs.items() if k[0] == "device"]
    assert recorded["copied"] is None  # refused: a copy
    assert recorded["conv2"] is not None  # reads the copy's planned output: recorded
    assert "conv1" not in recorded  # reads the feed, a new upload each run
    assert launch_counts["bound"] > 0


def test_bound_launches_stand_down_under_another_scratch_set(gpu):
    sets = ScratchSets(gpu.context, gpu.queue)
    owner, other = sets.take(), sets.take()
    kernel = gpu.kernel("elementwise", "activation")
    x = gpu.upload(np.full(8, -1.0, np.float32))
    with launches.recording() as record:
        kernel(
            gpu.queue,
            (8,),
            None,
            *x.kernel_args,
            *x.kernel_args,
            np.int32(8),
            np.int32(0),
            np.float32(0),
            np.float32(0),
        )
    bound = launches.bind(record, owner)
    assert bound is not None and len(bound.launches) == 1
    token = current_scratch.set(other)
    try:
        assert bound.enqueue(gpu.queue) is False
    finally:
        current_scratch.reset(token)
    token = current_scratch.set(owner)
    try:
        assert bound.enqueue(gpu.queue) is True
    finally:
        current_scratch.reset(token)
    gpu.queue.finish()


def test_a_refused_or_empty_recording_binds_nothing(gpu):
    with launches.recording() as record:
        launches.refuse("a copy")
        launches.refuse("an upload")  # the first reason stays
    assert record.refused == "a copy" and launches.bind(record, None) is None
    with launches.recording() as empty:
        pass
    assert launches.bind(empty, None) is None
    launches.refuse("outside any recording")  # nothing to refuse: no error


def test_each_owner_has_a_scratch_set_of_its_own_while_it_lives(gpu):
    class Pool:  # stands for a memory pool: any object that can be weakly referenced
        pass

    sets = ScratchSets(gpu.context, gpu.queue)
    pool = Pool()
    first = sets.take(pool)
    while_lent = sets.take(pool)  # the owner's set is lent: a common one
    assert while_lent is not first
    sets.give(while_lent)
    sets.give(first)
    assert sets.take(pool) is first
    sets.give(first)
    assert sets._free == [while_lent] and not sets._lent
    del pool, first
    gc.collect()
    assert len(sets._owned) == 0  # freed with its owner


async def test_recording_switched_off_by_the_environment_leaves_every_launch_to_its_layer(
    gpu, conv_network, launch_counts, monkeypatch
):
    monkeypatch.setenv(launches.ENV, "0")
    feeds, expected, opt = await _conv_case(conv_network, 4)
    await _run_each_and_compare(opt, feeds, expected)
    assert launch_counts["bound"] == 0 and launch_counts["python"] > 0


async def test_concat_inputs_written_in_place_are_not_copied_again(gpu, conv_network, monkeypatch):
    launched: list[str] = []
    call = TypedKernel.__call__

    def naming_call(self, *args, **kwargs):
        launched.append(self.kernel.function_name)
        return call(self, *args, **kwargs)

    monkeypatch.setattr(TypedKernel, "__call__", naming_call)
    feeds, expected, opt = await _conv_case(conv_network, 2)
    # both Concat inputs (the MaxPool's and the second Conv's) planned into its output
    await _run_each_and_compare(opt, feeds, expected)
    assert "concat_slab" not in launched and "gemm" in launched


async def test_later_runs_enqueue_consecutive_recorded_layers_as_one_step_and_profiled_runs_time_each(
    gpu, conv_network, launch_counts
):
    from flowrt.engine.scheduler.device_segments import BoundGroup

    feeds, expected, opt = await _conv_case(conv_network, 5)
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt, max_in_flight=1)
        for feed, want in zip(feeds[:4], expected[:4]):
            out = await model.run(feed)
            np.testing.assert_allclose(out["y"], want["y"], rtol=1e-5, atol=1e-6)
        ((key, program),) = [
            (k, v) for k, v in model.pools.pools[0].programs.items() if k[0] == "device program"
        ]
        groups = [step for step in program if isinstance(step, BoundGroup)]
        (segment,) = model.dataflow.segments
        # every layer once, consecutive recorded ones as one step
        assert groups and sum(len(g.nodes) for g in groups) + len(program) - len(groups) == len(segment.nodes)
        assert len(program) < len(segment.nodes)
        out = await model.run(feeds[4], profile=True)
        np.testing.assert_allclose(out["y"], expected[4]["y"], rtol=1e-5, atol=1e-6)
        timed = {r.layer for r in model.profile() if r.backend == "GpuAcc"}
    assert timed == {node.layer for node in segment.nodes}  # layer by layer when profiled


async def test_a_profiled_run_records_each_device_layers_kernel_launches(gpu, conv_network, launch_counts):
    opt = flowrt.optimize(conv_network(), backends=["GpuAcc", "CpuRef"])
    feeds = _random_feeds(0)
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt, max_in_flight=1)
        for _ in range(3):  # the first run, the recording one, then recorded runs
            await model.run(feeds)
        launch_counts.update(python=0, bound=0)
        await model.run(feeds)
        per_run = launch_counts["python"] + launch_counts["bound"]
        await model.run(feeds, profile=True)
        records = model.profile()
    assert per_run > 0
    assert sum(r.launches for r in records) == per_run  # layer by layer, the same launches
    convs = [r for r in records if r.kind == "Conv"]
    assert convs and all(r.launches >= 1 for r in convs)


def test_inspect_launches_prints_the_launches_a_run_by_kind(gpu, tmp_path, capsys):
    from onnx import TensorProto, helper, numpy_helper

    from flowrt.cli import main

    w = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w"
    )
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c"], ["y"], name="sigmoid"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [w],
    )
    path = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert main(["inspect", str(path), "--backends", "GpuAcc,CpuRef", "--launches"]) == 0
    out = capsys.readouterr().out
    found = re.search(r"kernel launches a run on GpuAcc: (\d+) for (\d+) layers", out)
    assert found, out
    lines = out.splitlines()
    after = lines[next(i for i, line in enumerate(lines) if line.startswith("kernel launches")) + 1 :]
    rows = {line.split()[0]: int(line.split()[1]) for line in after if line.startswith("  ")}
    assert rows["Conv"] >= 1
    assert int(found.group(1)) == sum(rows.values())


def _bound_adds(gpu, count: int):
    """``count`` recorded launches, each adding 1 to every element of a 64-float buffer."""
    import pyopencl as cl

    program = cl.Program(
        gpu.context, "__kernel void add1(__global float* a) { a[get_global_id(0)] += 1.0f; }"
    ).build()
    buffer = cl.Buffer(gpu.context, cl.mem_flags.READ_WRITE, 64 * 4)
    cl.enqueue_copy(gpu.queue, buffer, np.zeros(64, np.float32), is_blocking=True)
    record = launches.Recording()
    kernel = cl.Kernel(program, "add1")
    record.launches = [(kernel, (64,), (16,), (buffer,))] * count
    bound = launches.bind(record, scratch=None)
    assert bound is not None
    return bound, buffer


def _read(gpu, buffer) -> np.ndarray:
    import pyopencl as cl

    host = np.empty(64, np.float32)
    cl.enqueue_copy(gpu.queue, host, buffer, is_blocking=True)
    return host


def test_recorded_launches_are_enqueued_directly_through_the_opencl_library(gpu):
    from flowrt.workers.gpu import direct_enqueue

    assert direct_enqueue.available()  # pyopencl's own library, found in the process
    bound, buffer = _bound_adds(gpu, 5)
    assert bound._direct is not None and len(bound._direct) == 5
    before = launches.LAUNCHED[0]
    bound.enqueue_range(gpu.queue, 1, 4)
    np.testing.assert_array_equal(_read(gpu, buffer), np.full(64, 3, np.float32))
    assert launches.LAUNCHED[0] - before == 3


def test_recorded_launches_go_as_many_at_a_time_as_the_chunk_has_room_for(gpu):
    bound, buffer = _bound_adds(gpu, 5)
    room = launches.Room()
    token = launches.current_room.set(room)
    try:
        room.commands = 2
        assert list(bound.enqueue_each(gpu.queue)) == [2, 2, 1]
        room.commands = None  # no cut coming: all at once
        assert list(bound.enqueue_each(gpu.queue)) == [5]
    finally:
        launches.current_room.reset(token)
    assert list(bound.enqueue_each(gpu.queue)) == [5]  # outside any queue actor
    np.testing.assert_array_equal(_read(gpu, buffer), np.full(64, 15, np.float32))


def test_a_launch_the_driver_refuses_raises_a_backend_error_naming_the_opencl_error(gpu):
    from flowrt.errors import BackendError
    from flowrt.workers.gpu.direct_enqueue import DirectLaunches

    bound, _ = _bound_adds(gpu, 1)
    too_large = int(gpu.device.max_work_group_size) * 2  # past every device's limit
    direct = DirectLaunches([(bound.launches[0][0], (too_large,), (too_large,))])
    with pytest.raises(BackendError, match=r"clEnqueueNDRangeKernel failed: .*WORK_GROUP_SIZE"):
        direct.enqueue(gpu.queue)
