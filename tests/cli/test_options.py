"""-v, --threads, progress bars and Ctrl-C, on every command that has them."""

import json
import logging
import textwrap

import pytest
from interrupting import interrupt_when_running

import flowrt
import flowrt.progress
from flowrt.cli import main


def test_verbose_shows_fallbacks_and_their_reasons_on_stderr(fallback_model, capsys):
    assert main(["inspect", fallback_model, "--backends", "CpuAcc,CpuRef"]) == 0
    assert "falls back" not in capsys.readouterr().err
    assert main(["inspect", fallback_model, "--backends", "CpuAcc,CpuRef", "-v"]) == 0
    err = capsys.readouterr().err
    assert "flowrt: INFO: flowrt.engine.graph.optimizer: layer 'cumsum' (CumSum) falls back to CpuRef" in err
    assert "no CpuAcc kernel for CumSum" in err
    assert logging.getLogger("flowrt").level == logging.NOTSET and not logging.getLogger("flowrt").handlers


@pytest.mark.parametrize("argv, shown", [(["-v"], False), (["-vv"], True), (["-v", "-v"], True)])
def test_verbose_twice_shows_debug_records(argv, shown, tiny_model, monkeypatch, capsys):
    optimize = flowrt.optimize

    def logging_optimize(*args, **kwargs):
        logging.getLogger("flowrt.test").debug("a debug record")
        return optimize(*args, **kwargs)

    monkeypatch.setattr(flowrt, "optimize", logging_optimize)
    assert main(["inspect", tiny_model, "--backends", "CpuRef", *argv]) == 0
    assert ("flowrt: DEBUG: flowrt.test: a debug record" in capsys.readouterr().err) == shown


def test_verbose_may_come_before_the_command(fallback_model, capsys):
    assert main(["-v", "inspect", fallback_model, "--backends", "CpuAcc,CpuRef"]) == 0
    assert "falls back to CpuRef" in capsys.readouterr().err


def test_threads_sets_the_cpu_workers_of_run_and_bench(tiny_model, capsys):
    assert main(["run", tiny_model, "--backends", "CpuRef", "--threads", "1"]) == 0
    assert "threads: 1 CPU workers" in capsys.readouterr().out
    assert (
        main(["bench", tiny_model, "--backends", "CpuRef", "--threads", "1", "--iterations", "2", "--json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["threads"] == 1


@pytest.fixture
def bars(monkeypatch):
    """Draw the command line's bars at once, though stderr is not a terminal here."""
    monkeypatch.setattr(flowrt.progress, "SHOW_AFTER", 0.0)
    monkeypatch.setenv(flowrt.progress.PROGRESS_ENV, "1")


def test_run_iterations_and_bench_draw_progress_bars_and_the_load_bar(bars, tiny_model, capsys):
    assert main(["run", tiny_model, "--backends", "CpuRef", "--iterations", "3"]) == 0
    err = capsys.readouterr().err
    assert "running:" in err and "/3 " in err and "compiling kernels" in err
    assert main(["bench", tiny_model, "--backends", "CpuRef", "--iterations", "4"]) == 0
    err = capsys.readouterr().err
    assert "benchmarking:" in err and "/4 " in err and "compiling kernels" in err


def test_no_bars_where_stderr_is_not_a_terminal(tiny_model, monkeypatch, capsys):
    monkeypatch.setattr(flowrt.progress, "SHOW_AFTER", 0.0)
    monkeypatch.delenv(flowrt.progress.PROGRESS_ENV, raising=False)
    assert main(["run", tiny_model, "--backends", "CpuRef", "--iterations", "3"]) == 0
    assert main(["bench", tiny_model, "--backends", "CpuRef", "--iterations", "2"]) == 0
    assert capsys.readouterr().err == ""


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "{m}"],
        ["convert", "{m}", "-o", "{t}/m.flowrt"],
        ["tune", "{m}", "--backends", "CpuRef", "-o", "{t}/t.msgpack"],
    ],
)
def test_ctrl_c_in_any_command_exits_130_with_one_line(argv, tiny_model, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(flowrt, "optimize", _interrupt)
    assert main([a.format(m=tiny_model, t=tmp_path) for a in argv]) == 130
    assert capsys.readouterr().err == "flowrt: interrupted\n"


def test_sigint_during_bench_against_onnxruntime_exits_130_without_finishing_the_round(tiny_model):
    # The child's ONNX Runtime takes 0.2 s a request and says "running" from inside the first
    # request of a round; the round has as many requests as flowrt ran in 0.2 s (hundreds),
    # so Ctrl-C must not wait for the round to end.
    child = textwrap.dedent(
        """
        import sys, time
        import flowrt.bench
        import flowrt.cli

        class Session:
            calls = 0

            def run(self, names, feeds):
                Session.calls += 1
                if Session.calls == 2:  # the first after the warm-up
                    print("running", flush=True)
                time.sleep(0.2)

        flowrt.bench.ort_session = lambda path, threads: Session()
        sys.exit(flowrt.cli.main(sys.argv[1:]))
        """
    )
    argv = ["bench", tiny_model, "--backends", "CpuRef", "--vs", "onnxruntime", "--duration", "0.4"]
    returncode, err = interrupt_when_running(child, argv, timeout=20)
    assert returncode == 130
    assert err == "flowrt: interrupted\n"
