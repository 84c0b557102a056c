"""Loading an optimized network from a .flowrt file vs from ONNX, and loading damaged files.

    python benchmarks/serialize.py [--model resnet50] [--backends CpuRef] [--repeat 5]
                                   [--mutations 2000] [--fuzz-model squeezenet] [--seed 0]

Prints the time to an OptimizedNetwork both ways — ONNX parse + optimize, and
``flowrt.serialize.load`` of the file ``save`` wrote (mapped, the default, and read into memory
with ``mmap=False``) — and the ratio ONNX / .flowrt of the medians (higher is better for
.flowrt). Then writes ``--mutations`` damaged copies of a .flowrt file (seeded: bit
flips, truncations, overwritten header fields, inserted or deleted bytes, runs of junk), loads
each, and counts how it ended; every one must be a ModelLoadError (exit status 1 otherwise).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import flowrt
from flowrt import serialize
from flowrt.errors import ModelLoadError
from flowrt.models import LIGHT_MODELS, light_model

HEADER_FIELDS = {"magic": 0, "format version": 8, "api version": 10, "reserved": 14, "length": 16}
HEADER_FIELDS |= {"metadata length": 24, "checksum": 32, "flowrt version": 36}


def _model_path(name: str) -> Path:
    return light_model(name) if name in LIGHT_MODELS else Path(name)


def _median_ms(fn, repeat: int) -> tuple[float, float, object]:
    """(first call, median of ``repeat`` further calls) in ms, and the last result."""
    start = time.perf_counter()
    result = fn()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeat):
        del result  # one network alive at a time, as in a process that loads one model
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return first * 1e3, statistics.median(times) * 1e3, result


def _mutate(data: bytes, rng: np.random.Generator) -> tuple[str, bytearray]:
    """One seeded mutation of ``data`` that changes it: its name and the mutated bytes."""
    out = bytearray(data)
    kind = ("bit flips", "truncation", "header field", "insertion", "deletion", "junk")[rng.integers(6)]
    at = int(rng.integers(0, len(out)))
    if kind == "bit flips":
        for spot in rng.integers(0, len(out), rng.integers(1, 9)):
            out[spot] ^= 1 << int(rng.integers(8))
    elif kind == "truncation":
        del out[at:]
    elif kind == "header field":
        name = list(HEADER_FIELDS)[rng.integers(len(HEADER_FIELDS))]
        spot = HEADER_FIELDS[name] + int(rng.integers(2))
        out[spot] ^= int(rng.integers(1, 256))
        kind = f"header: {name}"
    elif kind == "insertion":
        out[at:at] = rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8).tobytes()
    elif kind == "deletion":
        del out[at : at + int(rng.integers(1, 64))]
    else:
        junk = rng.integers(0, 256, 16, dtype=np.uint8).tobytes()
        out[at : at + 16] = junk
        if out == data:
            out[at] ^= 0xFF
    return kind, out


def _fuzz(path: Path, count: int, seed: int, workdir: Path) -> bool:
    data = path.read_bytes()
    rng = np.random.default_rng(seed)
    target = workdir / "mutated.flowrt"
    endings: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[str] = collections.Counter()
    slowest = 0.0
    for _ in range(count):
        kind, mutated = _mutate(data, rng)
        kinds[kind] += 1
        target.write_bytes(mutated)
        start = time.perf_counter()
        try:
            serialize.load(target)
            endings["loaded (should not)"] += 1
        except ModelLoadError as e:
            reason = str(e).removeprefix(f"{target}: ").split(":")[0].removeprefix(f"model file {target} ")
            endings[f"ModelLoadError: {reason}"] += 1
        except Exception as e:  # the point of the exercise: report, don't stop
            endings[f"other: {type(e).__name__}"] += 1
        slowest = max(slowest, time.perf_counter() - start)
    errors = sum(n for ending, n in endings.items() if ending.startswith("ModelLoadError"))
    print(f"\n{count} mutated copies of {path.name} ({len(data) / 2**20:.1f} MiB), seed {seed}:")
    print("  mutations: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    for ending, n in endings.most_common():
        print(f"  {n:>6}  {ending}")
    verdict = (
        "all gave ModelLoadError" if errors == count else f"{count - errors} did NOT give ModelLoadError"
    )
    print(f"  {verdict}; slowest load {slowest * 1e3:.1f} ms")
    return errors == count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50", help="a light model name or an .onnx path")
    parser.add_argument("--backends", default="CpuRef")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--mutations", type=int, default=2000)
    parser.add_argument("--fuzz-model", default="squeezenet", help="the model whose .flowrt file is damaged")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    backends = args.backends.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        source = _model_path(args.model)
        onnx_first, onnx_ms, optimized = _median_ms(
            lambda: flowrt.optimize(flowrt.onnx.load(source), backends=backends), args.repeat
        )
        saved = workdir / "model.flowrt"
        start = time.perf_counter()
        serialize.save(optimized, saved)
        save_ms = (time.perf_counter() - start) * 1e3
        file_first, file_ms, loaded = _median_ms(lambda: serialize.load(saved), args.repeat)
        assert loaded.report() == optimized.report()
        del loaded
        read_first, read_ms, loaded = _median_ms(lambda: serialize.load(saved, mmap=False), args.repeat)
        assert loaded.report() == optimized.report()
        print(
            f"model: {source.name}  backends: {','.join(backends)}  .flowrt: {saved.stat().st_size / 2**20:.1f} MiB"
        )
        print(f"{'to an OptimizedNetwork':<28} {'first ms':>9} {'median ms':>10}")
        print(f"{'ONNX parse + optimize':<28} {onnx_first:>9.1f} {onnx_ms:>10.1f}")
        print(f"{'.flowrt load':<28} {file_first:>9.1f} {file_ms:>10.1f}")
        print(f"{'.flowrt load, mmap=False':<28} {read_first:>9.1f} {read_ms:>10.1f}")
        print(
            f"ratio ONNX / .flowrt (median): {onnx_ms / file_ms:.1f}x (target >= 3), "
            f"read into memory {onnx_ms / read_ms:.1f}x"
        )
        print(f"(save took {save_ms:.1f} ms)")
        del loaded
        fuzz_source = saved
        if args.fuzz_model != args.model:
            fuzz_source = workdir / "fuzz.flowrt"
            fuzz_net = flowrt.optimize(flowrt.onnx.load(_model_path(args.fuzz_model)), backends=backends)
            serialize.save(fuzz_net, fuzz_source)
        ok = _fuzz(fuzz_source, args.mutations, args.seed, workdir)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
