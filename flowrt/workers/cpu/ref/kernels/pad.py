"""Pad kernel: crop for negative pads, then numpy's pad for the rest."""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.pad import pad_widths
from flowrt.engine.graph.layers.reshape import const_ints
from flowrt.workers.cpu.ref.kernels import ref_kernel


@ref_kernel("Pad")
def pad(desc, data, pads=None, constant_value=None, axes=None):
    if desc.pads_attribute is not None:
        counts, value = list(desc.pads_attribute), desc.value
    else:
        counts = const_ints(pads)
        value = 0 if constant_value is None or constant_value.size == 0 else constant_value.reshape(-1)[0]
    widths = pad_widths(data.ndim, counts, const_ints(axes))
    # Negative pads remove elements; numpy's pad only adds them.
    crop = tuple(slice(max(-b, 0), data.shape[i] - max(-e, 0)) for i, (b, e) in enumerate(widths))
    cropped = data[crop]
    grow = [(max(b, 0), max(e, 0)) for b, e in widths]
    if not any(b or e for b, e in grow):
        return cropped.copy()
    if desc.mode == "constant":
        return np.pad(cropped, grow, mode="constant", constant_values=np.asarray(value).astype(data.dtype))
    return np.pad(cropped, grow, mode=desc.mode)  # ONNX's mode names are numpy's
