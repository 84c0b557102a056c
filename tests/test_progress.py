"""Runtime.load's progress bar: shown on stderr when asked (and the CLI asks), quiet otherwise."""

import pytest
from netbuild import serializable_network

import flowrt
import flowrt.progress
from flowrt.cli import main
from flowrt.models import light_model


@pytest.fixture
def bar_at_once(monkeypatch):
    """Show the bar as soon as a load starts, however quick the load; the command line's bars
    even though stderr is not a terminal here."""
    monkeypatch.setattr(flowrt.progress, "SHOW_AFTER", 0.0)
    monkeypatch.setenv(flowrt.progress.PROGRESS_ENV, "1")


async def _load(**kwargs) -> flowrt.LoadedNetwork:
    opt = flowrt.optimize(serializable_network(), backends=["CpuRef"])
    async with flowrt.Runtime(cpu_workers=1) as rt:
        return await rt.load(opt, **kwargs)


async def test_load_shows_a_bar_over_its_layers_when_asked(bar_at_once, capsys):
    model = await _load(progress=True)
    layers = len(model.dataflow.order)
    err = capsys.readouterr().err
    assert "compiling kernels" in err
    assert f"{layers}/{layers} " in err  # drawn once more as the load ends


async def test_load_is_quiet_unless_asked(bar_at_once, capsys):
    await _load()
    await _load(progress=False)
    assert capsys.readouterr().err == ""


async def test_quick_load_shows_no_bar(capsys):
    # The bar waits SHOW_AFTER (1 s): a load that takes less prints nothing.
    await _load(progress=True)
    assert capsys.readouterr().err == ""


async def test_failed_load_ends_its_bar_and_raises_the_error(bar_at_once, capsys, monkeypatch):
    def fail(self):
        raise RuntimeError("no kernel today")

    from flowrt.workers.cpu.ref.workload_factory import RefWorkload

    monkeypatch.setattr(RefWorkload, "prepare", fail, raising=False)
    with pytest.raises(flowrt.errors.BackendError, match="no kernel today"):
        await _load(progress=True)
    assert "compiling kernels" in capsys.readouterr().err


def test_flowrt_run_shows_the_bar(bar_at_once, tmp_path, capsys):
    path = tmp_path / "net.flowrt"
    flowrt.save(flowrt.optimize(serializable_network(), backends=["CpuRef"]), path)
    assert main(["run", str(path)]) == 0
    assert "compiling kernels" in capsys.readouterr().err


def test_flowrt_bench_json_is_quiet_and_library_loads_stay_quiet_after_the_cli(bar_at_once, capsys):
    path = str(light_model("squeezenet"))
    assert main(["bench", path, "--backends", "CpuRef", "--iterations", "1", "--json"]) == 0
    assert "compiling kernels" not in capsys.readouterr().err
    assert main(["inspect", path, "--backends", "CpuRef", "--memory"]) == 0
    assert "compiling kernels" in capsys.readouterr().err
    assert flowrt.progress.load_progress.get() is False
