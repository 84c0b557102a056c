"""``flowrt inspect``: the summary first (layers per backend, fallbacks with their reasons,
copies), and the table of every layer only when --layers asks for it."""

from flowrt.cli import main

BACKENDS = ["--backends", "CpuAcc,CpuRef"]  # CpuAcc declines fallback_model's CumSum


def test_inspect_prints_the_summary_and_no_layer_table_without_layers(fallback_model, capsys):
    assert main(["inspect", fallback_model, *BACKENDS]) == 0
    out = capsys.readouterr().out
    assert "layers per backend: CpuAcc=1, CpuRef=1" in out
    assert "fallbacks from CpuAcc (1 layer):\n  'cumsum' (CumSum) -> CpuRef: CpuAcc: no CpuAcc kernel" in out
    assert "copies: none" in out
    assert "layers (" not in out and "declined by" not in out and "  name  " not in out
    assert out.rstrip().endswith("(every layer, the graph passes and substitutions: flowrt inspect --layers)")


def test_inspect_layers_adds_the_table_of_every_layer_after_the_summary(fallback_model, capsys):
    assert main(["inspect", fallback_model, *BACKENDS, "--layers"]) == 0
    out = capsys.readouterr().out
    summary, _, table = out.partition("layers (2):\n")
    assert "fallbacks from CpuAcc (1 layer):" in summary
    rows = [line.split() for line in table.splitlines()]
    assert rows[0] == ["name", "type", "output", "backend"]
    assert ["relu", "Relu", "float32(1,", "4)", "CpuAcc"] in rows
    assert ["cumsum", "CumSum", "float32(1,", "4)", "CpuRef"] in rows
    assert "declined by CpuAcc: no CpuAcc kernel for CumSum" in table
    assert "flowrt inspect --layers)" not in out
