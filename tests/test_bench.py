"""`flowrt bench`: percentiles, throughput, load time, and the ONNX Runtime comparison."""

import json

import pytest

from flowrt.bench import BenchResult, format_results, run_bench
from flowrt.cli import main
from flowrt.models import light_model


def test_bench_against_onnxruntime_reports_both_engines():
    results = run_bench(
        str(light_model("squeezenet")),
        ["CpuRef"],
        iterations=5,
        concurrency=2,
        vs_onnxruntime=True,
        progress=False,
    )
    assert [r.engine for r in results] == ["flowrt", "onnxruntime"]
    for r in results:
        s = r.summary()
        assert s["requests"] == 5
        assert 0 < s["p50_ms"] <= s["p90_ms"] <= s["p99_ms"]
        assert s["throughput_rps"] > 0 and s["load_ms"] > 0
    table = format_results(results)
    assert table.splitlines()[0].split() == [
        "engine",
        "p50",
        "ms",
        "p90",
        "ms",
        "p99",
        "ms",
        "req/s",
        "load",
        "ms",
    ]
    assert table.splitlines()[-1].startswith("ratio")


def test_percentiles_and_throughput_are_computed_from_the_latencies():
    result = BenchResult("flowrt", tuple(i / 1000 for i in range(1, 101)), wall_s=2.0, load_s=0.5)
    assert result.percentile_ms(50) == pytest.approx(50.5)
    assert result.percentile_ms(99) == pytest.approx(99.01)
    assert result.throughput == 50


def test_cli_bench_json(capsys):
    assert (
        main(["bench", str(light_model("squeezenet")), "--backends", "CpuRef", "--iterations", "3", "--json"])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["results"]["flowrt"]["requests"] == 3
    assert "onnxruntime" not in report["results"]


def test_cli_bench_rejects_bad_arguments(capsys):
    assert main(["bench", "--iterations", "0"]) == 2
    assert "--iterations and --concurrency must be at least 1" in capsys.readouterr().err
    assert main(["bench", "--vs", "tensorflow"]) == 2
    assert "--vs takes 'onnxruntime'" in capsys.readouterr().err
    assert main(["bench", "--duration", "0"]) == 2
    assert "--duration must be a positive number of seconds, got 0.0" in capsys.readouterr().err


def test_duration_runs_for_that_long_and_the_peer_runs_as_many_requests():
    results = run_bench(
        str(light_model("squeezenet")),
        ["CpuAcc", "CpuRef"],
        iterations=1,
        vs_onnxruntime=True,
        progress=False,
        duration=0.6,
    )
    ours, theirs = results
    assert len(ours.latencies) > 2 and len(theirs.latencies) == len(ours.latencies)
    assert 0.6 <= ours.wall_s < 0.6 + 2 * max(ours.latencies) + 0.05


def test_cli_bench_plots_the_latency_distribution(tmp_path, capsys):
    plot = tmp_path / "latency.png"
    assert main(["bench", "--iterations", "4", "--backends", "CpuAcc,CpuRef", "--plot", str(plot)]) == 0
    assert f"latency plot: {plot}" in capsys.readouterr().out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 5000


def test_bench_at_batch_n_runs_the_rebatched_model_and_onnxruntime_as_batch_1_runs():
    results = run_bench(
        str(light_model("squeezenet")),
        ["CpuAcc", "CpuRef"],
        iterations=2,
        vs_onnxruntime=True,
        progress=False,
        batch=3,
    )
    ours, theirs = results
    assert (ours.batch, theirs.batch) == (3, 3)
    assert ours.note == ""
    assert theirs.note.startswith("onnxruntime refused batch 3 (")
    assert "invalid dimensions for input: data_0" in theirs.note
    assert theirs.note.endswith("each of its requests is 3 runs of batch 1")
    assert ours.summary()["samples_per_s"] == pytest.approx(3 * ours.throughput)
    table = format_results(results).splitlines()
    assert table[-2] == "each request is a batch of 3 samples: samples/s = req/s x 3"
    assert table[-1] == f"note: {theirs.note}"


def test_cli_bench_batch_json_and_bad_batch(capsys):
    model = str(light_model("squeezenet"))
    assert (
        main(["bench", model, "--backends", "CpuAcc,CpuRef", "--iterations", "2", "--batch", "2", "--json"])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["batch"] == 2 and report["results"]["flowrt"]["batch"] == 2
    assert report["results"]["flowrt"]["requests"] == 2
    assert main(["bench", "--batch", "0"]) == 2
    assert "--batch must be at least 1, got 0" in capsys.readouterr().err
