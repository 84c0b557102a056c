"""Priorities on a device whose queues take no hints (PoCL): the order between levels comes
from the queue actors' shared admission, so high-priority work overtakes queued low work."""

import numpy as np
import trio
import trio.testing

import flowrt
from flowrt.types import Priority, TensorInfo
from flowrt.workers.gpu.device import cl
from flowrt.workers.gpu.queues import Admission, open_queue_actors

SPIN = """
__kernel void spin(__global float* y, int n) {
    float a = get_global_id(0);
    for (int i = 0; i < n; ++i) a = a * 0.999f + 1.0f;
    y[get_global_id(0)] = a;
}
"""


async def test_admission_admits_the_highest_priority_waiting_first():
    admission = Admission(1)
    await admission.acquire(Priority.LOW)  # the one on the device
    admitted = []

    async def wait(priority, label):
        await admission.acquire(priority)
        admitted.append(label)

    async with trio.open_nursery() as nursery:
        for priority, label in [(Priority.LOW, "low"), (Priority.MEDIUM, "medium"), (Priority.HIGH, "high")]:
            nursery.start_soon(wait, priority, label)
            await trio.testing.wait_all_tasks_blocked()
        cancelled = trio.CancelScope()

        async def wait_then_cancel():
            with cancelled:
                await wait(Priority.HIGH, "cancelled")

        nursery.start_soon(wait_then_cancel)
        await trio.testing.wait_all_tasks_blocked()
        cancelled.cancel()
        await trio.testing.wait_all_tasks_blocked()
        for _ in range(3):
            admission.release()
            await trio.testing.wait_all_tasks_blocked()
    assert admitted == ["high", "medium", "low"]
    assert admission.in_flight == 1


def _spin_on(kernel, y, iterations):
    return lambda queue: kernel(queue, (128,), (64,), y, np.int32(iterations))


async def test_high_priority_submission_overtakes_queued_low_priority_work(gpu):
    program = cl.Program(gpu.context, SPIN).build()
    kernels = [cl.Kernel(program, "spin") for _ in range(5)]
    outputs = [cl.Buffer(gpu.context, cl.mem_flags.READ_WRITE, 128 * 4) for _ in kernels]
    finished = []

    async def submit(actor, enqueue, label):
        await actor.submit(enqueue)
        finished.append(label)

    async with open_queue_actors(gpu, in_flight_limit=1) as actors:
        async with trio.open_nursery() as nursery:
            for i in range(4):  # one at a time: trio starts tasks in no set order
                low = _spin_on(kernels[i], outputs[i], 10**6)
                nursery.start_soon(submit, actors[Priority.LOW], low, f"low{i}")
                await trio.testing.wait_all_tasks_blocked()  # low0 on the device, the rest queued
            # the queued low work is held here, not on the device: one on it, one waiting for it
            assert (actors.admission.in_flight, actors.admission.waiting) == (1, 1)
            nursery.start_soon(submit, actors[Priority.HIGH], _spin_on(kernels[4], outputs[4], 10**6), "high")
            await trio.testing.wait_all_tasks_blocked()
            assert (actors.admission.in_flight, actors.admission.waiting) == (1, 2)
    assert finished == ["low0", "high", "low1", "low2", "low3"]


def _widening_chain(rows: int, width: int, layers: int = 4) -> flowrt.Network:
    """x (1, width) broadcast to (rows, width), ``layers`` MatMuls by (width, width), then the
    mean over the rows: the work grows with rows and width while the feed and the output stay
    one row. (NVIDIA's driver copies between the device and pageable host memory while the
    enqueueing thread waits: a large feed or output holds that thread until its queue reaches
    the copy, and no later run is enqueued meanwhile.)"""
    rng = np.random.default_rng(0)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, width)))
    h = net.add_layer("Add", inputs=[x, np.zeros((rows, width), np.float32)])
    for _ in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        h = net.add_layer("MatMul", inputs=[h, w])
    net.add_output("y", net.add_layer("ReduceMean", flowrt.descriptors.ReduceMean(axes=(0,)), inputs=[h]))
    return net


async def _long_run_model(rt, seconds: float):
    """A model on GpuAcc whose run takes at least ``seconds`` on this device, and its feed:
    on a fast GPU a fixed size finishes before the next run is even queued."""
    sizes = [(128, 512), (512, 1024), (1024, 2048), (2048, 4096), (4096, 4096), (8192, 4096)]
    for rows, width in sizes:
        model = await rt.load(
            flowrt.optimize(_widening_chain(rows, width), backends=["GpuAcc"]), max_in_flight=6
        )
        x = np.ones((1, width), np.float32)
        await model.run({"x": x})  # warm-up
        start = trio.current_time()
        await model.run({"x": x})
        if trio.current_time() - start >= seconds or (rows, width) == sizes[-1]:
            break
        await model.unload()
    return model, x


async def test_a_high_priority_run_finishes_before_queued_low_priority_runs(gpu):
    finished = []

    async def run(model, x, priority, label):
        await model.run({"x": x}, priority=priority)
        finished.append(label)

    async with flowrt.Runtime(cpu_workers=1) as rt:
        model, x = await _long_run_model(rt, 0.03)
        assert model.dataflow.segments[0].device
        async with trio.open_nursery() as nursery:
            for i in range(5):
                nursery.start_soon(run, model, x, Priority.LOW, f"low{i}")
                await trio.testing.wait_all_tasks_blocked()  # two low runs on the device, the rest queued
            assert finished == []  # the low work is still in flight when the high run arrives
            nursery.start_soon(run, model, x, Priority.HIGH, "high")
    # Overtaken by at most the two low runs already on the device when it arrived.
    assert finished.index("high") <= 2, finished
    assert finished[-1].startswith("low")
