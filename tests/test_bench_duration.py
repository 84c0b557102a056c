"""``flowrt bench --duration`` takes a positive finite number of seconds: infinity, NaN, zero
and negative durations are refused before any model is loaded, as other bad CLI arguments are
(exit status 2, one line naming the option and the value)."""

import pytest

from flowrt.bench import run_bench
from flowrt.cli import main
from flowrt.errors import ArgumentError


@pytest.mark.parametrize(
    "value, found",
    [
        ("inf", "got inf (a finite one: the benchmark would never end)"),
        ("nan", "got nan (a finite one: the benchmark would never end)"),
        ("-1", "got -1.0"),
        ("0", "got 0.0"),
    ],
)
def test_bench_refuses_a_duration_that_is_not_a_positive_finite_number(capsys, value, found):
    assert main(["bench", "--duration", value]) == 2
    err = capsys.readouterr().err
    assert f"flowrt: error: InputError: --duration must be a positive number of seconds, {found}" in err
    assert "Traceback" not in err


def test_run_bench_refuses_an_infinite_duration():
    with pytest.raises(ArgumentError, match=r"run_bench: duration.*positive finite number of seconds.*inf"):
        run_bench("unused.onnx", ["CpuRef"], iterations=1, duration=float("inf"))
