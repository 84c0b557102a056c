"""Queue actors: work submitted from trio completes through OpenCL event callbacks."""

import threading

import numpy as np
import pytest
import trio
import trio.testing

import flowrt
from flowrt.errors import BackendError
from flowrt.types import Priority
from flowrt.workers.gpu.kernels import LOCAL_SIZE, global_size
from flowrt.workers.gpu.queues import QueueActor, open_queue_actors


def _relu_on(kernel, x, y):
    """An enqueue function: y = relu(x) on the queue the actor passes in."""
    return lambda queue: kernel(
        queue, global_size(x.size), (LOCAL_SIZE,), *x.kernel_args, *y.kernel_args, np.int32(x.size),
        np.int32(1), np.float32(0), np.float32(0),
    )  # fmt: skip


async def test_submitter_wakes_when_its_kernel_completes(gpu):
    kernel = gpu.kernel("elementwise", "activation")
    host = np.linspace(-1, 1, 1000, dtype=np.float32)
    x, y = gpu.upload(host), gpu.empty(host.shape)
    async with open_queue_actors(gpu) as actors:
        assert [a.priority for a in actors] == [Priority.HIGH, Priority.MEDIUM, Priority.LOW]
        await actors[Priority.HIGH].submit(_relu_on(kernel, x, y))
        np.testing.assert_array_equal(y.get(), np.maximum(host, 0))


async def test_concurrent_submissions_block_no_thread_per_kernel(gpu):
    kernels = [gpu.kernel("elementwise", "activation") for _ in range(12)]
    host = np.linspace(-1, 1, 4096, dtype=np.float32)
    x = gpu.upload(host)
    outputs = [gpu.empty(host.shape) for _ in kernels]
    async with open_queue_actors(gpu) as actors:
        threads_before = threading.active_count()
        async with trio.open_nursery() as nursery:
            for i, (kernel, y) in enumerate(zip(kernels, outputs)):
                nursery.start_soon(actors[i % 3].submit, _relu_on(kernel, x, y))
            await trio.testing.wait_all_tasks_blocked()
            # The driver may have a callback thread or two of its own, never one per kernel.
            assert threading.active_count() <= threads_before + 2
    for y in outputs:
        np.testing.assert_array_equal(y.get(), np.maximum(host, 0))


async def test_queues_take_priority_hints_only_where_the_device_does(gpu):
    async with open_queue_actors(gpu) as actors:
        assert {a.priority_hinted for a in actors} == {gpu.priority_hints}
    if "Portable Computing Language" in gpu.device.platform.name:
        assert not gpu.priority_hints  # PoCL refuses CL_QUEUE_PRIORITY_KHR


async def test_a_failing_enqueue_raises_backend_error(gpu):
    def enqueue(queue):
        raise ValueError("bad arguments")

    async with open_queue_actors(gpu) as actors:
        with pytest.raises(BackendError, match="LOW OpenCL queue failed: bad arguments"):
            await actors[Priority.LOW].submit(enqueue)


async def test_work_cancelled_before_the_actor_reaches_it_is_dropped(gpu):
    called = []
    actor = QueueActor(gpu, Priority.MEDIUM)
    with trio.CancelScope() as scope:
        scope.cancel()
        await actor.submit(called.append)  # queued in the inbox; the actor is not running yet
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        await trio.testing.wait_all_tasks_blocked()
        actor.send_channel.close()
    assert called == []


async def test_runs_complete_through_the_waiters_which_end_with_the_runtime(
    gpu, conv_network, conv_net_reference
):
    feeds, expected = conv_net_reference
    opt = flowrt.optimize(conv_network(), backends=["GpuAcc", "CpuRef"])
    before = set(threading.enumerate())
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt)
        waiters = [t for t in set(threading.enumerate()) - before if t.name.startswith("flowrt-gpu-")]
        assert sorted(t.name for t in waiters) == [
            "flowrt-gpu-high-completion",
            "flowrt-gpu-low-completion",
            "flowrt-gpu-medium-completion",
        ]
        for _ in range(3):
            out = await model.run(feeds)
        np.testing.assert_allclose(out["y"], expected["y"], rtol=1e-5, atol=1e-6)
    assert not any(t.is_alive() for t in waiters)


async def test_a_host_chain_beside_a_device_chain_runs_as_one_segment_each(gpu):
    # A float chain GpuAcc takes, beside a bool one it does not (CpuRef), inserted alternately:
    # in the graph's order they interleave, a device submission per float layer.
    net = flowrt.Network()
    x = net.add_input("x", flowrt.types.TensorInfo((4, 8)))
    m = net.add_input("m", flowrt.types.TensorInfo((4, 8), "int64"))
    relu = net.add_layer("Relu", inputs=[x], name="relu")
    flag = net.add_layer("Cast", flowrt.descriptors.Cast(to=9), [m], name="to_bool")
    sigmoid = net.add_layer("Sigmoid", inputs=[relu], name="sigmoid")
    negated = net.add_layer("Not", inputs=[flag], name="not")
    tanh = net.add_layer("Tanh", inputs=[sigmoid], name="tanh")
    mask = net.add_layer("Cast", flowrt.descriptors.Cast(to=1), [negated], name="to_float")
    net.add_output("y", net.add_layer("Add", inputs=[tanh, mask], name="add"))
    opt = flowrt.optimize(net, backends=["GpuAcc", "CpuRef"])
    placed = opt.assignments()
    assert [placed[n] for n in ("relu", "sigmoid", "tanh", "add")] == ["GpuAcc"] * 4
    assert [placed[n] for n in ("to_bool", "not", "to_float")] == ["CpuRef"] * 3
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((4, 8)).astype(np.float32), "m": rng.integers(0, 2, (4, 8))}
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt)
        segments = [[n.layer for n in s.nodes] for s in model.dataflow.segments]
        assert segments == [["relu", "sigmoid", "tanh"], ["to_bool", "not", "to_float"], ["add"]]
        got = await model.run(feeds)
        want = await (await rt.load(flowrt.optimize(net, backends=["CpuRef"]))).run(feeds)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-6, atol=1e-6)
