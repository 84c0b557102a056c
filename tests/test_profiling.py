"""Profiling: per-workload records, Chrome traces, and `flowrt run --profile`."""

import json

import numpy as np
from netbuild import branchy_network

import flowrt
from flowrt.cli import main
from flowrt.models import light_model
from flowrt.profiling import chrome_trace, top_layers, write_chrome_trace


async def test_profiled_run_records_every_workload():
    async with flowrt.Runtime() as rt:
        model = await rt.load(flowrt.optimize(branchy_network(), backends=["CpuRef"]))
        await model.run({"x": np.ones((2, 4), np.float32)})
        assert model.profile() == []
        await model.run({"x": np.ones((2, 4), np.float32)}, profile=True)
    records = model.profile()
    assert sorted(r.layer for r in records) == ["add", "left", "relu", "right"]
    assert all(r.backend == "CpuRef" and r.end_ns >= r.start_ns and r.slices == 1 for r in records)
    by_layer = {r.layer: r for r in records}
    assert by_layer["relu"].end_ns <= by_layer["left"].start_ns
    assert by_layer["left"].end_ns <= by_layer["add"].start_ns
    assert model.profile(clear=True) and model.profile() == []


async def test_runtime_profiling_records_every_run_by_default():
    async with flowrt.Runtime(profiling=True) as rt:
        model = await rt.load(flowrt.optimize(branchy_network(), backends=["CpuRef"]))
        for _ in range(3):
            await model.run({"x": np.ones((1, 4), np.float32)})
        await model.run({"x": np.ones((1, 4), np.float32)}, profile=False)
    records = model.profile()
    assert sorted({r.run for r in records}) == [0, 1, 2]
    assert len(records) == 12
    ranked = top_layers(records)
    assert {layer for layer, *_ in ranked} == {"add", "left", "relu", "right"}
    assert all(calls == 3 for *_, calls in ranked)
    assert [ms for _, _, ms, _ in ranked] == sorted((ms for _, _, ms, _ in ranked), reverse=True)


async def test_chrome_trace_has_one_complete_event_per_workload_and_a_track_per_worker(tmp_path):
    async with flowrt.Runtime() as rt:
        model = await rt.load(flowrt.optimize(branchy_network(), backends=["CpuRef"]))
        await model.run({"x": np.ones((1, 4), np.float32)}, profile=True)
    records = model.profile()
    write_chrome_trace(records, tmp_path / "trace.json")
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert trace == json.loads(json.dumps(chrome_trace(records)))
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert sorted(e["name"] for e in complete) == sorted(r.layer for r in records)
    for event in complete:
        assert {"name", "ph", "ts", "dur", "pid", "tid"} <= event.keys()
        assert event["dur"] >= 0 and event["ts"] >= 0
    tracks = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert set(tracks) == {e["tid"] for e in complete}
    assert set(tracks.values()) == {r.worker for r in records}


def test_flowrt_run_profile_writes_the_trace_and_prints_top_layers(tmp_path, capsys):
    trace_path = tmp_path / "trace.json"
    assert (
        main(
            [
                "run",
                str(light_model("squeezenet")),
                "--backends",
                "CpuRef",
                "--iterations",
                "2",
                "--profile",
                str(trace_path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "top layers by time:" in out
    trace = json.loads(trace_path.read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    opt = flowrt.optimize(flowrt.onnx.load(light_model("squeezenet")), backends=["CpuRef"])
    assert len(complete) == 2 * len(opt.assignments())
    assert {e["name"] for e in complete} == set(opt.assignments())
    lines = out.splitlines()
    top = [line.split() for line in lines[lines.index("top layers by time:") + 1 :] if " ms over " in line]
    assert top and all(row[0] in opt.assignments() for row in top)
    times = [float(row[2]) for row in top]
    assert times == sorted(times, reverse=True) and times[0] > 0
