"""Performance hints: stream settings chosen from the model's measured cost (flowrt.hints)."""

import numpy as np
import pytest
import trio

import flowrt
from flowrt import hints
from flowrt.errors import ArgumentError, ShapeError
from flowrt.hints import Costs, throughput_choice
from flowrt.types import TensorInfo


def _net(batchable: bool = True) -> flowrt.Network:
    """x (1, 3, 8, 8) -> conv -> relu -> global average pool -> y; not ``batchable``: y
    folded to (2, 2) by a Reshape (axis 0 no longer holds one row per sample)."""
    rng = np.random.default_rng(0)
    net = flowrt.Network()
    x = net.add_input("x", TensorInfo((1, 3, 8, 8)))
    conv = net.add_layer("Conv", None, [x, rng.standard_normal((4, 3, 3, 3)).astype(np.float32)])
    pooled = net.add_layer("GlobalAveragePool", inputs=[net.add_layer("Relu", inputs=[conv])])
    if not batchable:
        pooled = net.add_layer("Reshape", None, [pooled, np.array([2, 2], np.int64)])
    net.add_output("y", pooled)
    return net


def _feeds(i: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(i).standard_normal((1, 3, 8, 8)).astype(np.float32)}


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Each test measures afresh, in a cache directory of its own."""
    monkeypatch.setenv("FLOWRT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_throughput_choice_takes_the_cheapest_batch_whose_run_fits_half_the_budget():
    costs = Costs(lone_s=0.010, per_request_s={1: 0.008, 2: 0.006, 4: 0.005})
    # budget 8 lone runs = 80 ms: a batch of 4 on 2 pools runs 4 * 2 * 5 ms = 40 ms <= 40 ms
    choice = throughput_choice(costs, pools=2, latency_budget=None)
    assert (choice.max_batch, choice.max_in_flight) == (4, 2 * 2 * 4)
    assert choice.max_delay == pytest.approx(0.0025)  # a quarter of a lone run
    assert "-> batch 4" in choice.reason and "batch 2 6.00 ms" in choice.reason
    # 30 ms of budget: a batch of 2 runs 24 ms, more than 15: unbatched
    tight = throughput_choice(costs, pools=2, latency_budget=0.030)
    assert (tight.max_batch, tight.max_in_flight, tight.max_delay) == (1, 4, 0.0)
    # a larger batch that costs more per request is not taken
    worse = throughput_choice(Costs(0.01, {1: 0.008, 2: 0.009}), pools=1, latency_budget=1.0)
    assert worse.max_batch == 1


async def test_a_latency_stream_runs_each_request_alone_at_once():
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await rt.load(flowrt.optimize(_net(), backends=["CpuAcc", "CpuRef"]))
        expected = [(await model.run(_feeds(i)))["y"] for i in range(6)]
        async with model.stream(hint="latency") as s:
            assert (s.choice.max_batch, s.choice.max_in_flight) == (1, model.pools.count)
            assert s.choice.costs is None  # nothing measured
            got = [(await s.submit(_feeds(i)))["y"] for i in range(6)]
            assert s.batch_counts == {1: 6}  # each request alone
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


async def test_a_throughput_stream_measures_once_then_reads_the_cache(cache_dir, monkeypatch):
    opt = flowrt.optimize(_net(), backends=["CpuAcc", "CpuRef"])
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await rt.load(opt)
        expected = [(await model.run(_feeds(i)))["y"] for i in range(12)]
        pools = model.pools.count
        async with model.stream(hint="throughput") as s:
            choice = s.choice
            got = []
            async with trio.open_nursery() as nursery:

                async def send():
                    for i in range(12):
                        await s.send(_feeds(i))
                    s.close()

                nursery.start_soon(send)
                async for out in s:
                    got.append(out["y"])
    assert choice.hint == "throughput" and choice.costs is not None
    assert 1 in choice.costs.per_request_s and choice.costs.lone_s > 0
    assert choice.max_in_flight == 2 * pools * choice.max_batch
    assert len(list(cache_dir.glob("hints/*.json"))) == 1
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)

    async def no_measuring(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(hints, "measure", no_measuring)
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await rt.load(opt)
        async with model.stream(hint="throughput") as s:
            assert s.choice == choice

    # flowrt's sources changed (a newer version, other kernels): the costs are measured again
    monkeypatch.setattr(hints.source_stamps, "flowrt_digest", lambda: "another flowrt")
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await rt.load(opt)
        with pytest.raises(AssertionError, match="measured again"):
            async with model.stream(hint="throughput"):
                pass


async def test_settings_given_explicitly_win_over_the_hint():
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await rt.load(flowrt.optimize(_net(), backends=["CpuAcc", "CpuRef"]))
        async with model.stream(hint="throughput", max_batch=2, max_in_flight=3, max_delay=0.001) as s:
            assert (s.max_batch, s.max_in_flight, s.max_delay) == (2, 3, 0.001)
            assert (s.choice.max_batch, s.choice.max_in_flight, s.choice.max_delay) == (2, 3, 0.001)
            out = await s.submit(_feeds(0))
        np.testing.assert_allclose(out["y"], (await model.run(_feeds(0)))["y"], rtol=1e-5, atol=1e-6)


async def test_a_network_that_cannot_be_rebatched_streams_unbatched():
    async with flowrt.Runtime(cpu_workers=2) as rt:
        model = await rt.load(flowrt.optimize(_net(batchable=False), backends=["CpuAcc", "CpuRef"]))
        async with model.stream(hint="throughput") as s:
            assert s.choice.max_batch == 1 and list(s.choice.costs.per_request_s) == [1]
            out = await s.submit(_feeds(1))
        np.testing.assert_allclose(out["y"], (await model.run(_feeds(1)))["y"], rtol=1e-5, atol=1e-6)
        with pytest.raises(ShapeError):
            async with model.stream(hint="throughput", max_batch=2):
                pass


async def test_a_hint_at_load_measures_there_and_is_the_streams_default():
    async with flowrt.Runtime(cpu_workers=2) as rt:
        opt = flowrt.optimize(_net(), backends=["CpuAcc", "CpuRef"])
        model = await rt.load(opt, hint="THROUGHPUT")
        assert model.hint == "throughput" and model.measured_costs is not None
        # batch sizes measured beyond the one chosen are unloaded again
        chosen = hints.throughput_choice(model.measured_costs, model.pools.count, None).max_batch
        assert all(batch <= chosen for batch in model._batched)
        async with model.stream() as s:
            assert s.choice.hint == "throughput"
        async with model.stream(max_batch=1) as s:  # explicit settings: no hint
            assert not hasattr(s, "choice")
        # a model loaded without a hint: its streams default to the throughput hint
        plain = await rt.load(opt)
        assert plain.hint is None and plain.stream().hint == "throughput"
        assert type(plain.stream(max_in_flight=2)).__name__ == "Stream"


async def test_bad_hints_are_refused_with_their_value():
    async with flowrt.Runtime(cpu_workers=1) as rt:
        opt = flowrt.optimize(_net(), backends=["CpuRef"])
        with pytest.raises(
            ArgumentError, match="Runtime.load: hint must be one of 'latency', 'throughput', got 'fast'"
        ):
            await rt.load(opt, hint="fast")
        model = await rt.load(opt)
        with pytest.raises(ArgumentError, match="LoadedNetwork.stream: hint must be one of"):
            model.stream(hint=3)
        with pytest.raises(ArgumentError, match="latency_budget"):
            model.stream(hint="throughput", latency_budget=-1)
