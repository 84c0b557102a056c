"""Priorities on a device whose queues take no hints (PoCL): the order between levels comes
from the queue actors' shared admission, so high-priority work overtakes queued low work."""

import numpy as np
import trio
import trio.testing

import flowrt
from flowrt.types import Priority
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


async def test_a_high_priority_run_finishes_before_queued_low_priority_runs(gpu, matmul_chain):
    opt = flowrt.optimize(matmul_chain(), backends=["GpuAcc"])
    x = np.ones((128, 512), np.float32)
    finished = []

    async def run(model, priority, label):
        await model.run({"x": x}, priority=priority)
        finished.append(label)

    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt, max_in_flight=6)
        assert model.dataflow.segments[0].device
        async with trio.open_nursery() as nursery:
            for i in range(5):
                nursery.start_soon(run, model, Priority.LOW, f"low{i}")
                await trio.testing.wait_all_tasks_blocked()  # two low runs on the device, the rest queued
            nursery.start_soon(run, model, Priority.HIGH, "high")
    # Overtaken by at most the two low runs already on the device when it arrived.
    assert finished.index("high") <= 2, finished
    assert finished[-1].startswith("low")
