"""GpuAcc in a run: tensors stay on the device between GpuAcc layers, cross only where the host
reads them, and a run's GPU segments are one submission each to the queue actors."""

import attrs
import numpy as np
import pytest
import trio
import trio.testing

import flowrt
from flowrt.errors import BackendError, RunError
from flowrt.types import TensorInfo
from flowrt.workers.gpu.allocator import DeviceArena
from flowrt.workers.gpu.context import DeviceContext
from flowrt.workers.gpu.kernels import gemm as gemm_module
from flowrt.workers.gpu.tensor import GpuTensor


@pytest.fixture
def transfers(monkeypatch):
    """Counts of host->device uploads and device->host copies made through GpuAcc."""
    counts = {"upload": 0, "download": 0}
    enqueue_upload, enqueue_download = DeviceContext.enqueue_upload, DeviceContext.enqueue_download
    get = GpuTensor.get

    def counting(kind, fn):
        def wrapper(*args, **kwargs):
            counts[kind] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(DeviceContext, "enqueue_upload", counting("upload", enqueue_upload))
    monkeypatch.setattr(DeviceContext, "enqueue_download", counting("download", enqueue_download))
    monkeypatch.setattr(GpuTensor, "get", counting("download", get))
    return counts


async def test_gpuacc_intermediates_stay_on_the_device(gpu, conv_network, conv_net_reference, transfers):
    feeds, expected = conv_net_reference
    opt = flowrt.optimize(conv_network(), backends=["GpuAcc", "CpuRef"])
    assert opt.backend_counts() == {"GpuAcc": len(opt.assignments())}
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt, max_in_flight=1)
        (segment,) = model.dataflow.segments
        assert segment.device and len(segment.nodes) == len(opt.assignments())
        assert all(isinstance(a, DeviceArena) for a in model.pools.pools[0].arenas.values())
        after_load = dict(transfers)
        for _ in range(2):
            out = await model.run(feeds)
            np.testing.assert_allclose(out["y"], expected["y"], rtol=1e-5, atol=1e-6)
    # per run: the feed goes up, the output comes down; nothing else crosses
    assert transfers == {"upload": after_load["upload"] + 2, "download": after_load["download"] + 2}


async def test_a_bound_output_is_downloaded_into_the_callers_array(
    gpu, conv_network, conv_net_reference, monkeypatch
):
    feeds, expected = conv_net_reference
    written_into = []
    enqueue_download = DeviceContext.enqueue_download

    def recording(self, queue, tensor, into=None):
        written_into.append(into)
        return enqueue_download(self, queue, tensor, into)

    monkeypatch.setattr(DeviceContext, "enqueue_download", recording)
    opt = flowrt.optimize(conv_network(), backends=["GpuAcc", "CpuRef"])
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt, max_in_flight=1)
        (segment,) = model.dataflow.segments
        assert segment.device and segment.downloads == (model.dataflow.outputs["y"],)
        for _ in range(2):
            target = np.empty_like(expected["y"])
            out = await model.run(feeds, outputs={"y": target})
            assert out["y"] is target and written_into[-1] is target  # the download wrote it
            np.testing.assert_allclose(target, expected["y"], rtol=1e-5, atol=1e-6)
        # Without a bound array, the run still returns a new one.
        again = (await model.run(feeds))["y"]
        assert written_into[-1] is None and not np.shares_memory(again, target)
        np.testing.assert_allclose(again, expected["y"], rtol=1e-5, atol=1e-6)


def _zigzag_network() -> flowrt.Network:
    """x -> Relu (GpuAcc) -> Sign (CpuRef: no GpuAcc kernel) -> Sigmoid -> Add(relu, sigmoid) -> y."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((4, 8)))
    relu = net.add_layer("Relu", inputs=[x], name="relu")
    sign = net.add_layer("Sign", inputs=[relu], name="sign")
    sigmoid = net.add_layer("Sigmoid", inputs=[sign], name="sigmoid")
    net.add_output("y", net.add_layer("Add", inputs=[relu, sigmoid], name="add"))
    return net


async def test_a_host_layer_between_gpuacc_layers_reads_a_downloaded_copy(gpu, transfers):
    opt = flowrt.optimize(_zigzag_network(), backends=["GpuAcc", "CpuRef"])
    backends = {layer.name: layer.backend for layer in opt.graph}
    assert backends["sign"] == "CpuRef" and backends["add"] == "GpuAcc"
    x = np.linspace(-2, 2, 32, dtype=np.float32).reshape(4, 8)
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt, max_in_flight=1)
        assert [s.device for s in model.dataflow.segments] == [True, False, True]
        before = dict(transfers)
        y = (await model.run({"x": x}))["y"]
    r = np.maximum(x, 0)
    np.testing.assert_allclose(y, r + 1 / (1 + np.exp(-np.sign(r))), rtol=1e-6)
    # up: x, sign's output; down: relu's output (for sign), y. relu's output stays up for add.
    assert transfers == {"upload": before["upload"] + 2, "download": before["download"] + 2}


async def test_a_network_on_the_device_has_its_pools_allocated_at_load(gpu, conv_network, conv_net_reference):
    # device memory is slow to allocate, and no RSS: a run that first needs a second pool
    # does not pay for it (host-only networks make theirs then: tests/integration/test_memory.py)
    feeds, expected = conv_net_reference
    opt = flowrt.optimize(conv_network(), backends=["GpuAcc", "CpuRef"])
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt, max_in_flight=3)
        assert len(model.pools.pools) == 3
        out = await model.run(feeds)
    np.testing.assert_allclose(out["y"], expected["y"], rtol=1e-5, atol=1e-6)


async def test_device_pools_are_zeroed_on_release(gpu, conv_network, conv_net_reference):
    feeds, expected = conv_net_reference
    opt = flowrt.optimize(conv_network(), backends=["GpuAcc"])
    async with flowrt.Runtime(cpu_workers=1, zero_memory_on_release=True) as rt:
        model = await rt.load(opt, max_in_flight=1)
        for _ in range(2):
            out = await model.run(feeds)
            np.testing.assert_allclose(out["y"], expected["y"], rtol=1e-5, atol=1e-6)
        (arena,) = model.pools.pools[0].arenas.values()
        host = np.ones(arena.nbytes, np.uint8)
        flowrt.workers.gpu.device.cl.enqueue_copy(gpu.queue, host, arena.buffer, is_blocking=True)
    assert not host.any()


async def test_a_failing_gpuacc_workload_raises_run_error_and_returns_the_pool(
    gpu, conv_network, conv_net_reference
):
    feeds, _ = conv_net_reference
    opt = flowrt.optimize(conv_network(), backends=["GpuAcc"])
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt, max_in_flight=1)
        node = next(n for n in model.dataflow.order if n.layer == "conv2")

        def broken(queue, inputs, outputs=None):
            raise ValueError("deliberate")

        node.workload.enqueue = broken
        with pytest.raises(RunError, match=r"layer 'conv2' on backend GpuAcc failed: ValueError: deliberate"):
            await model.run(feeds)
        assert model.pools.free_count == 1


async def test_a_cancelled_run_waits_for_its_device_work_then_returns_the_pool(gpu, matmul_chain):
    opt = flowrt.optimize(matmul_chain(), backends=["GpuAcc"])
    x = np.ones((128, 512), np.float32)
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt, max_in_flight=1)
        expected = (await model.run({"x": x}))["y"]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(model.run, {"x": x})
            await trio.testing.wait_all_tasks_blocked()  # enqueued, waiting for the device
            assert model.pools.free_count == 0
            nursery.cancel_scope.cancel()
        assert model.pools.free_count == 1
        np.testing.assert_array_equal((await model.run({"x": x}))["y"], expected)


async def test_runtime_opencl_device_picks_gpuacc_device(gpu, conv_network, conv_net_reference):
    feeds, expected = conv_net_reference
    opt = flowrt.optimize(conv_network(), backends=["GpuAcc"])
    async with flowrt.Runtime(cpu_workers=1, opencl_device="0:0") as rt:
        model = await rt.load(opt, max_in_flight=1)
        out = await model.run(feeds)
    np.testing.assert_allclose(out["y"], expected["y"], rtol=1e-5, atol=1e-6)
    async with flowrt.Runtime(cpu_workers=1, opencl_device="no such device") as rt:
        with pytest.raises(BackendError, match="OpenCL device 'no such device' not found"):
            await rt.load(opt)


async def test_kernel_temporaries_come_from_their_pools_scratch_set_that_later_runs_reuse(
    gpu, conv_network, conv_net_reference, monkeypatch
):
    feeds, expected = conv_net_reference
    planned = gemm_module.plan_gemm

    # partial sums in scratch, as on a large device
    def split_k(shape, batches, units, cpu=False, tilings=gemm_module.TILINGS, whole_k=False):
        plan = planned(shape, batches, units)
        k_split = -(-shape[2] // 2 // gemm_module.TK) * gemm_module.TK
        return attrs.evolve(plan, splits=-(-shape[2] // k_split), k_split=k_split)

    monkeypatch.setattr(gemm_module, "plan_gemm", split_k)
    opt = flowrt.optimize(conv_network(), backends=["GpuAcc", "CpuRef"])
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt, max_in_flight=4)
        owned = gpu.scratch_sets._owned
        await model.run(feeds)
        (first_pool,) = [p for p in model.pools.pools if p in owned]
        first = owned[first_pool]
        buffers = {id(b) for b in first.buffers.values()}
        assert buffers  # the GEMMs' partial sums went to the pool's scratch set
        # the feed went up and the output came down through its pinned staging memory
        assert len(first.staging) >= 2
        results = {}

        async def run(i, priority):
            results[i] = await model.run(feeds, priority=priority)

        for _ in range(3):  # concurrent runs on every queue, each in a pool of its own
            async with trio.open_nursery() as nursery:
                for i, priority in enumerate([flowrt.Priority.HIGH, flowrt.Priority.LOW] * 2):
                    nursery.start_soon(run, i, priority)
            for out in results.values():
                np.testing.assert_allclose(out["y"], expected["y"], rtol=1e-5, atol=1e-6)
        sets = [owned[p] for p in model.pools.pools if p in owned]
        assert len(sets) == len({id(s) for s in sets}) == 4  # one set per pool
        assert buffers == {id(b) for b in first.buffers.values()}  # the first run's, reused
        assert not any(s.retired for s in sets)
        assert not gpu.scratch_sets._lent  # every set given back


def test_a_kernel_temporary_outside_a_submission_is_a_buffer_of_its_own(gpu):
    a, b = gpu.scratch((16,)), gpu.scratch((16,))
    assert a.buffer is not b.buffer and a.shape == (16,)


def _view_of_an_upload_network() -> flowrt.Network:
    """CumSum's output crosses to the device for a view (CumSum and Sign run on CpuRef), which
    Sign reads on the host; the second device segment adds the view and Sign's output,
    uploaded in the same size."""
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((4, 8)))
    a = net.add_layer("CumSum", inputs=[x, np.array(1, np.int64)], name="cumsum")
    r = net.add_layer("Reshape", inputs=[a, np.array([4, 8], np.int64)], name="view")
    s = net.add_layer("Sign", inputs=[r], name="sign")
    net.add_output("z", net.add_layer("Add", inputs=[r, s], name="add"))
    return net


async def test_a_view_of_an_uploaded_tensor_keeps_its_buffer_from_the_next_upload(gpu):
    opt = flowrt.optimize(_view_of_an_upload_network(), backends=["GpuAcc", "CpuRef"])
    backends = {layer.name: layer.backend for layer in opt.graph}
    assert backends["cumsum"] == backends["sign"] == "CpuRef"
    assert backends["view"] == backends["add"] == "GpuAcc"
    x = np.arange(-16, 16, dtype=np.float32).reshape(4, 8)
    a = np.cumsum(x, axis=1)
    async with flowrt.Runtime(cpu_workers=1) as rt:
        model = await rt.load(opt, max_in_flight=1)
        assert [s.device for s in model.dataflow.segments] == [False, True, False, True]
        for _ in range(3):  # the first runs, the recording one, a recorded one
            z = (await model.run({"x": x}))["z"]
            # not sign(a) + sign(a): CumSum's copy was not taken for Sign's output's upload
            np.testing.assert_array_equal(z, a + np.sign(a))
