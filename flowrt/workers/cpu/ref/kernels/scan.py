"""The Scan kernel, both forms (see ``flowrt.engine.graph.layers.scan``).

Scan inputs are read through views with their scan axis first (no copy); each iteration
feeds the body one slice of each. Stacked outputs are made C-contiguous.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from flowrt.engine.graph.layers.scan import ScanDescriptor
from flowrt.engine.graph.shapes import normalize_axis
from flowrt.errors import ShapeError
from flowrt.types import TensorInfo
from flowrt.workers.cpu.ref.kernels import ref_kernel
from flowrt.workers.cpu.ref.kernels.subgraphs import Bodies, empty_output, runner, stack


def _length(sequences: Sequence[np.ndarray]) -> int:
    """The common length of the sequences (scan axis first); ShapeError when they differ."""
    lengths = {len(s) for s in sequences}
    if len(lengths) != 1:
        raise ShapeError(
            f"Scan: the scan inputs must have one length along their axes, got {sorted(lengths)}"
        )
    return lengths.pop()


def _steps(
    bodies: Bodies,
    states: list[np.ndarray],
    sequences: Sequence[np.ndarray],
    reverse: Sequence[int],
    length: int,
    outer: Mapping[str, np.ndarray],
) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """Run the body over the first ``length`` slices of ``sequences`` (from the last where
    ``reverse``): the final states and each scan output's values in iteration order."""
    n = len(states)
    scans: list[list[np.ndarray]] = []
    for t in range(length):
        slices = [s[length - 1 - t] if back else s[t] for s, back in zip(sequences, reverse)]
        outputs = bodies.run(0, [*states, *slices], outer)
        states = outputs[:n]
        if not scans:
            scans = [[] for _ in outputs[n:]]
        for values, value in zip(scans, outputs[n:]):
            values.append(value)
    return states, scans


@ref_kernel("Scan")
def scan(desc: ScanDescriptor, *values: np.ndarray | None, bodies: Bodies | None = None):
    """(N final states, K scan outputs)."""
    run = runner(bodies, "Scan")
    if desc.opset < 9:
        return _batched(desc, values[0], values[1:], run)  # type: ignore[arg-type]  # only sequence_lens is optional
    n, m = desc.num_states, desc.num_scan_inputs
    states: list[np.ndarray] = [v for v in values[:n] if v is not None]
    sequences, reverse = [], []
    for j, x in enumerate(values[n : n + m]):
        assert x is not None  # a scan input is never optional
        axis, direction = desc.input_setting(j)
        sequences.append(np.moveaxis(x, normalize_axis(axis, x.ndim, f"Scan: scan input {j}"), 0))
        reverse.append(direction)
    outer = dict(zip(desc.captures, values[n + m :]))
    states, scans = _steps(run, states, sequences, reverse, _length(sequences), outer)  # type: ignore[arg-type]  # captures are never absent
    results = []
    for k in range(desc.num_scans):
        if not scans:
            results.append(empty_output(run.empty_outputs[n + k]))
            continue
        axis, direction = desc.output_setting(k)
        stacked = stack(scans[k][::-1] if direction else scans[k], f"Scan: scan output {k}")
        axis = normalize_axis(axis, stacked.ndim, f"Scan: scan output {k}")
        results.append(np.ascontiguousarray(np.moveaxis(stacked, 0, axis)))
    return (*states, *results)


def _batched(desc: ScanDescriptor, lens: np.ndarray | None, values: Sequence[np.ndarray], run: Bodies):
    """Opset 8's Scan: each batch entry scanned along axis 1 for its ``sequence_lens``, its
    scan outputs 0 past its length."""
    n, m = desc.num_states, desc.num_scan_inputs
    states, xs = values[:n], values[n : n + m]
    outer = dict(zip(desc.captures, values[n + m :]))
    batch, length = xs[0].shape[0], _length([x.swapaxes(0, 1) for x in xs])
    lengths = np.full(batch, length, dtype=np.int64) if lens is None else np.asarray(lens).reshape(-1)
    if len(lengths) != batch or np.any(lengths < 0) or np.any(lengths > length):
        raise ShapeError(
            f"Scan: sequence_lens must hold {batch} lengths in [0, {length}], got {lengths.tolist()}"
        )
    reverse = [desc.input_setting(j)[1] for j in range(m)]
    finals: list[list[np.ndarray]] = [[] for _ in range(n)]
    entries: list[list[np.ndarray | None]] = [[] for _ in range(desc.num_scans)]
    for b in range(batch):
        size = int(lengths[b])
        final, scans = _steps(run, [s[b] for s in states], [x[b] for x in xs], reverse, size, outer)
        for k, value in enumerate(final):
            finals[k].append(value)
        for k in range(desc.num_scans):
            entries[k].append(stack(scans[k], f"Scan: scan output {k}") if scans else None)
    outputs = [
        stack(f, f"Scan: state {k}") if f else empty_output(run.empty_outputs[k])
        for k, f in enumerate(finals)
    ]
    for k, per_entry in enumerate(entries):
        outputs.append(_padded(per_entry, length, run.empty_outputs[n + k]))
    return tuple(outputs)


def _padded(per_entry: Sequence[np.ndarray | None], length: int, info: TensorInfo) -> np.ndarray:
    """The batch entries' stacked values, each padded with zeros to ``length`` (an entry that
    ran no step is all zeros), stacked."""
    made = next((e for e in per_entry if e is not None), None)
    if made is not None:
        element, dtype = made.shape[1:], made.dtype
    else:
        element, dtype = empty_output(info).shape[2:], info.dtype.numpy
    out = np.zeros((len(per_entry), length, *element), dtype=dtype)
    for b, values in enumerate(per_entry):
        if values is not None:
            out[b, : len(values)] = values
    return out
