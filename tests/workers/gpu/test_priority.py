"""Priorities on a device whose queues take no hints (PoCL): the order between levels comes
from the queue actors' shared admission, so high-priority work overtakes queued low work."""

import numpy as np
import pytest
import trio
import trio.testing

import flowrt
from flowrt.types import Priority, TensorInfo
from flowrt.workers.gpu.completion import EventCompletion
from flowrt.workers.gpu.device import cl
from flowrt.workers.gpu.queues import CHUNK_S, RECENT_S, Admission, _Submission, open_queue_actors

SPIN = """
__kernel void spin(__global float* y, int n) {
    float a = get_global_id(0);
    for (int i = 0; i < n; ++i) a = a * 0.999f + 1.0f;
    y[get_global_id(0)] = a;
}
"""


def _waiter(admission: Admission, admitted: list[str]):
    """``wait(priority, label)``: acquire a place, then note ``label`` in ``admitted``."""

    async def wait(priority, label):
        await admission.acquire(priority)
        admitted.append(label)

    return wait


async def test_admission_admits_the_highest_priority_waiting_first():
    admission = Admission(1)
    await admission.acquire(Priority.LOW)  # the one on the device
    admitted: list[str] = []
    wait = _waiter(admission, admitted)

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
            # the HIGH one goes on beside low0 (a place beyond the limit); low1 still waits
            assert (actors.admission.in_flight, actors.admission.waiting) == (2, 1)
    assert sorted(finished[:2]) == ["high", "low0"] and finished[2:] == ["low1", "low2", "low3"]


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


class _Owner:
    """A run's memory pool as the admission sees it: whose submissions are timed together."""


async def test_the_time_per_command_falls_to_a_faster_measurement_and_rises_slowly(autojump_clock):
    admission, owner = Admission(2), _Owner()
    await admission.acquire(Priority.HIGH)  # a HIGH submission arrives: lower ones are cut
    admission.release()
    assert admission.commands_per_chunk(Priority.LOW, owner) is None  # not timed yet: whole
    admission.timed(owner, 0.01, 10)  # 1 ms a command
    assert admission.commands_per_chunk(Priority.LOW, owner) == 1
    admission.timed(owner, 0.001, 10)  # 0.1 ms: taken at once
    assert admission.commands_per_chunk(Priority.LOW, owner) == round(CHUNK_S / 1e-4)
    admission.timed(owner, 0.1, 10)  # waited behind other work: 10% more at most
    assert admission.commands_per_chunk(Priority.MEDIUM, owner) == round(CHUNK_S / 1.1e-4)
    assert admission.commands_per_chunk(Priority.HIGH, owner) is None  # nothing above HIGH
    assert Admission(None).commands_per_chunk(Priority.LOW, owner) is None
    await trio.sleep(RECENT_S + 0.01)  # no HIGH since: nothing to make way for
    assert admission.commands_per_chunk(Priority.LOW, owner) is None
    await admission.acquire(Priority.MEDIUM)  # a MEDIUM one: LOW is cut for it, MEDIUM is not
    admission.release()
    assert admission.commands_per_chunk(Priority.LOW, owner) == round(CHUNK_S / 1.1e-4)
    assert admission.commands_per_chunk(Priority.MEDIUM, owner) is None


def _spins(kernels, outputs, order, label, iterations=3 * 10**5):
    """A submission that enqueues a spin kernel on each output, noting each in ``order``."""

    def enqueue(queue):
        for i, (kernel, y) in enumerate(zip(kernels, outputs)):
            event = kernel(queue, (128,), (64,), y, np.int32(iterations))
            order.append(f"{label}{i}")
            yield
        return event

    return enqueue


async def test_a_high_submission_goes_between_the_chunks_of_a_low_one(gpu):
    program = cl.Program(gpu.context, SPIN).build()
    kernels = [cl.Kernel(program, "spin") for _ in range(7)]
    outputs = [cl.Buffer(gpu.context, cl.mem_flags.READ_WRITE, 128 * 4) for _ in kernels]
    owner, order = _Owner(), []
    async with open_queue_actors(gpu, in_flight_limit=1) as actors:
        actors.admission.timed(owner, 1.0, 1)  # a command takes longer than a chunk: one each
        await actors.admission.acquire(Priority.HIGH)  # a HIGH submission went by just now
        actors.admission.release()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                actors[Priority.LOW].submit, _spins(kernels[:6], outputs[:6], order, "low"), owner
            )
            await trio.testing.wait_all_tasks_blocked()  # low0 on the device, low1 waits for it
            assert order == ["low0"]
            high = _spins(kernels[6:], outputs[6:], order, "high")
            nursery.start_soon(actors[Priority.HIGH].submit, high)
    assert order == ["low0", "high0", "low1", "low2", "low3", "low4", "low5"]
    assert actors.admission.in_flight == 0


async def test_a_cancelled_submitter_waits_for_the_chunks_already_on_the_device(gpu):
    program = cl.Program(gpu.context, SPIN).build()
    kernels = [cl.Kernel(program, "spin") for _ in range(4)]
    outputs = [cl.Buffer(gpu.context, cl.mem_flags.READ_WRITE, 128 * 4) for _ in kernels]
    owner, order = _Owner(), []
    events = []

    def enqueue(queue):
        for kernel, y in zip(kernels, outputs):
            events.append(kernel(queue, (128,), (64,), y, np.int32(3 * 10**5)))
            order.append("low")
            yield

    async with open_queue_actors(gpu, in_flight_limit=1) as actors:
        actors.admission.timed(owner, 1.0, 1)
        await actors.admission.acquire(Priority.HIGH)
        actors.admission.release()
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(actors[Priority.LOW].submit, enqueue, owner)
                await trio.testing.wait_all_tasks_blocked()
                scope.cancel()  # with its first chunk on the device
        # the submit returned only once what it had enqueued was done, and enqueued no more
        assert len(events) == 1
        assert events[0].command_execution_status == cl.command_execution_status.COMPLETE
    assert actors.admission.in_flight == 0


async def test_a_chunk_is_timed_from_its_first_command_or_the_end_of_the_chunk_before():
    chunks = []
    for started, done in [(0.0, 1.0), (0.5, 1.5), (2.0, 2.2)]:
        completion = EventCompletion()
        completion.done_at = done
        chunks.append((started, completion))
    submission = _Submission(lambda queue: None, EventCompletion(), chunks=chunks)
    # 1.0 s, then 0.5 s behind the first (queued at 0.5, run from 1.0), then 0.2 s
    assert submission.device_seconds() == pytest.approx(1.7)
    chunks[1][1].done_at = None  # not reported yet: no figure
    assert submission.device_seconds() == 0.0


async def test_a_high_submission_takes_a_place_beyond_the_limit():
    admission = Admission(2)
    await admission.acquire(Priority.LOW)
    await admission.acquire(Priority.LOW)  # the device full for LOW
    admitted: list[str] = []
    wait = _waiter(admission, admitted)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, Priority.LOW, "low")
        await trio.testing.wait_all_tasks_blocked()
        assert admitted == [] and admission.in_flight == 2
        nursery.start_soon(wait, Priority.HIGH, "high")
        await trio.testing.wait_all_tasks_blocked()
        assert admitted == ["high"] and admission.in_flight == 3  # beside the two LOW chunks
        nursery.start_soon(wait, Priority.HIGH, "high2")
        await trio.testing.wait_all_tasks_blocked()
        assert admitted == ["high"]  # one place beyond, not more
        admission.release()
        await trio.testing.wait_all_tasks_blocked()
        assert admitted == ["high", "high2"]  # HIGH first, again beyond the limit
        admission.release()
        await trio.testing.wait_all_tasks_blocked()
        assert admitted == ["high", "high2"] and admission.in_flight == 2  # LOW waits for room
        admission.release()
        await trio.testing.wait_all_tasks_blocked()
        assert admitted == ["high", "high2", "low"] and admission.in_flight == 2
