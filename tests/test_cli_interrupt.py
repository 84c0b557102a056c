"""Ctrl-C during a ``flowrt`` command: exit status 130 and one line, not a traceback."""

import textwrap

import onnx
import pytest
from interrupting import interrupt_when_running
from onnx import TensorProto, helper

import flowrt.bench
import flowrt.cli
from flowrt.loaded_network import LoadedNetwork


@pytest.fixture
def tiny_model(tmp_path) -> str:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return str(path)


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


async def _interrupt_in_a_nursery(*args, **kwargs):
    raise BaseExceptionGroup("Exceptions from Trio nursery", [KeyboardInterrupt()])


@pytest.mark.parametrize("interrupt", [_interrupt, _interrupt_in_a_nursery])
def test_ctrl_c_during_flowrt_run_exits_130_with_one_line(tiny_model, monkeypatch, capsys, interrupt):
    monkeypatch.setattr(LoadedNetwork, "run", interrupt)
    assert flowrt.cli.main(["run", tiny_model, "--backends", "CpuRef"]) == 130
    assert capsys.readouterr().err == "flowrt: interrupted\n"


def test_ctrl_c_during_flowrt_bench_exits_130_with_one_line(tiny_model, monkeypatch, capsys):
    monkeypatch.setattr(flowrt.bench, "run_bench", _interrupt)
    assert flowrt.cli.main(["bench", tiny_model, "--backends", "CpuRef"]) == 130
    assert capsys.readouterr().err == "flowrt: interrupted\n"


def test_an_exception_group_without_ctrl_c_is_not_taken_for_one(tiny_model, monkeypatch):
    async def fail(*args, **kwargs):
        raise BaseExceptionGroup("Exceptions from Trio nursery", [ValueError("not an interrupt")])

    monkeypatch.setattr(LoadedNetwork, "run", fail)
    with pytest.raises(BaseExceptionGroup):
        flowrt.cli.main(["run", tiny_model, "--backends", "CpuRef"])


def test_sigint_while_flowrt_run_runs_exits_130_with_one_line(tiny_model):
    # The child says "running" from inside its first model run, then runs until interrupted.
    child = textwrap.dedent(
        """
        import sys
        import warnings
        import flowrt.cli
        from flowrt.loaded_network import LoadedNetwork

        # The interrupt may land in this wrapper between calling the run and awaiting it: the
        # coroutine it dropped is the wrapper's, not flowrt's, and must not print a warning.
        warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)

        original = LoadedNetwork.run

        async def run(self, *args, **kwargs):
            if not getattr(run, "told", False):
                run.told = True
                print("running", flush=True)
            return await original(self, *args, **kwargs)

        LoadedNetwork.run = run
        sys.exit(flowrt.cli.main(sys.argv[1:]))
        """
    )
    argv = ["run", tiny_model, "--backends", "CpuRef", "--iterations", "100000000"]
    returncode, err = interrupt_when_running(child, argv, timeout=30)
    assert returncode == 130
    assert err == "flowrt: interrupted\n"
