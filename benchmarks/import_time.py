"""Time to ``import flowrt`` against ``import onnxruntime``, each in a fresh process.

    python benchmarks/import_time.py [--repeat 9] [--model shufflenet] [--backends CpuRef]

Each measurement is a new Python process that times one statement with ``time.perf_counter``
around it (the interpreter's own start, the same for both, is left out), the processes of
the different rows taking turns so that a busy spell of the machine falls on all of them:

- ``import onnxruntime``, the peer, and ``import flowrt``: the import alone; the ratio of
  their medians is what issue 33 bounds (at most 1.5).
- ``+ InferenceSession``: the import, then a session on one of onnx's light models
  (``--model``) and one run; for flowrt the first use pays what its import leaves for later
  (onnx to parse the model, the layer kinds, numba where CpuAcc is used, the worker pool).
  ``--backends`` is handed to flowrt's session (default: the session's own defaults).

Bytecode is written on a first, untimed round (``PYTHONDONTWRITEBYTECODE`` is dropped for the
children), so no row pays for compiling Python source. Prints a table of medians (and the
fastest) and the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

from flowrt.models import light_model

_TIMED = """
import time
_start = time.perf_counter()
{code}
print(time.perf_counter() - _start)
"""

_FLOWRT_SESSION = """
import numpy as np, flowrt
backends = {backends!r}
session = flowrt.InferenceSession({path!r}, **({{"backends": backends.split(",")}} if backends else {{}}))
session.run(None, {{i.name: np.full([d if isinstance(d, int) else 1 for d in i.shape], 0.5, np.float32)
    for i in session.get_inputs()}})
"""

_ORT_SESSION = """
import numpy as np, onnxruntime
session = onnxruntime.InferenceSession({path!r}, providers=["CPUExecutionProvider"])
session.run(None, {{i.name: np.full([d if isinstance(d, int) else 1 for d in i.shape], 0.5, np.float32)
    for i in session.get_inputs()}})
"""


def _seconds(code: str, env: dict[str, str]) -> float:
    """The seconds ``code`` takes in a fresh process (its own clock, around it only)."""
    done = subprocess.run(
        [sys.executable, "-c", _TIMED.format(code=code)], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"the timed process failed:\n{code}\n{done.stderr}")
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9, help="processes per row (default 9)")
    parser.add_argument("--model", default="shufflenet", help="the light model of the session rows")
    parser.add_argument("--backends", default="", help="flowrt's session backends (default: its defaults)")
    args = parser.parse_args()
    path = str(light_model(args.model))
    rows = {
        "import onnxruntime": "import onnxruntime",
        "import flowrt": "import flowrt",
        "onnxruntime + InferenceSession": _ORT_SESSION.format(path=path),
        "flowrt + InferenceSession": _FLOWRT_SESSION.format(path=path, backends=args.backends),
    }
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for code in rows.values():  # untimed: writes the bytecode, fills numba's cache
        _seconds(code, env)
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.repeat):
        for name, code in rows.items():
            times[name].append(_seconds(code, env))
    backends = args.backends or "the session's defaults"
    print(
        f"fresh process per measurement, median of {args.repeat}; sessions on {args.model}, flowrt on {backends}\n"
    )
    print("| statement | median ms | fastest ms |")
    print("| --- | ---: | ---: |")
    for name, seconds in times.items():
        print(f"| {name} | {statistics.median(seconds) * 1e3:.0f} | {min(seconds) * 1e3:.0f} |")
    ratio = statistics.median(times["import flowrt"]) / statistics.median(times["import onnxruntime"])
    first = statistics.median(times["flowrt + InferenceSession"]) / statistics.median(
        times["onnxruntime + InferenceSession"]
    )
    print(f"\nimport flowrt / import onnxruntime: {ratio:.2f} (issue 33 asks for at most 1.5)")
    print(f"flowrt / ONNX Runtime, import + session + one run: {first:.2f}")


if __name__ == "__main__":
    main()
