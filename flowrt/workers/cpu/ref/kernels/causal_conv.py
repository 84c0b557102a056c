"""CausalConvWithState kernel."""

from __future__ import annotations

import numpy as np

from flowrt.errors import ShapeError
from flowrt.workers.cpu.ref.kernels import ref_kernel
from flowrt.workers.cpu.ref.kernels.activation import sigmoid


def _padded(x: np.ndarray, past_state: np.ndarray | None, k: int) -> np.ndarray:
    """The input with its ``k - 1`` positions of left context before it; ShapeError when the
    given past state does not have that shape."""
    batch, channels, _ = x.shape
    expected = (batch, channels, k - 1)
    if past_state is None:
        past_state = np.zeros(expected, x.dtype)
    elif past_state.shape != expected:
        raise ShapeError(
            f"CausalConvWithState: past_state of shape {expected} (batch, channels, k - 1) "
            f"expected, got {past_state.shape}"
        )
    return np.concatenate([past_state, x], axis=2)


@ref_kernel("CausalConvWithState")
def causal_conv_with_state(desc, x, weight, bias=None, past_state=None):
    channels, k = x.shape[1], weight.shape[2]
    if weight.shape != (channels, 1, k) or (bias is not None and bias.shape != (channels,)):
        raise ShapeError(
            f"CausalConvWithState: weight ({channels}, 1, k) and bias ({channels},) expected, "
            f"got {weight.shape} and {None if bias is None else bias.shape}"
        )
    padded = _padded(x, past_state, k)
    # float16 and bfloat16 sum in float32 and round once, as the Conv kernels do.
    windows = np.lib.stride_tricks.sliding_window_view(padded.astype(np.float32), k, axis=2)
    out = np.einsum("bclk,ck->bcl", windows, weight[:, 0].astype(np.float32))
    if bias is not None:
        out += bias.astype(np.float32)[:, None]
    # onnx rounds the convolution to the input's type before the activation, which runs in float32.
    out = out.astype(x.dtype).astype(np.float32)
    if desc.activation != "none":
        out = out * sigmoid(out)
    return out.astype(x.dtype), padded[:, :, padded.shape[2] - (k - 1) :]
