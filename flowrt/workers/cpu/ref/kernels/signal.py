"""DFT, STFT, window function and MelWeightMatrix kernels.

Each computes with the numpy calls, in the types and order of onnx's reference
implementation (``np.fft`` in the input's precision, a window's products in its output
type, the mel edges in float64), so that the results agree with it to the last bits.
"""

from __future__ import annotations

import numpy as np

from flowrt.engine.graph.layers.signal import (
    check_mel_edges,
    count_value,
    dft_axis,
    dft_length,
    stft_frames,
)
from flowrt.errors import ShapeError
from flowrt.workers.cpu.ref.kernels import ref_kernel


def _as_complex(x: np.ndarray) -> np.ndarray:
    """A [..., 1] real or [..., 2] (real, imaginary) tensor as one value per element."""
    if x.shape[-1] == 1:
        return x[..., 0]
    if x.shape[-1] != 2:
        raise ShapeError(f"a last dim of 1 (real) or 2 (complex) expected, got shape {x.shape}")
    return x[..., 0] + 1j * x[..., 1]


def _as_pairs(values: np.ndarray) -> np.ndarray:
    """Complex values as a [..., 2] (real, imaginary) tensor."""
    return np.stack((np.real(values), np.imag(values)), axis=-1)


def _forward(x: np.ndarray, length: int, axis: int, onesided: int) -> np.ndarray:
    """The DFT of ``length`` along ``axis`` of a [..., 1 or 2] tensor, as [..., 2]."""
    spectrum = np.fft.fft(_as_complex(x), n=length, axis=axis)
    if onesided:
        spectrum = np.take(spectrum, np.arange(length // 2 + 1), axis=axis)
    return _as_pairs(spectrum)


@ref_kernel("DFT")
def dft(desc, x, dft_length_input=None, axis_input=None):
    where = "DFT"
    if x.ndim < 2:
        raise ShapeError(f"{where}: an input of rank 2 or more expected, got shape {x.shape}")
    given_axis = count_value(axis_input, "axis", where, -x.ndim)
    axis = dft_axis(desc, given_axis, x.ndim)
    length = dft_length(desc, x.shape[axis], count_value(dft_length_input, "dft_length", where, 1))
    if not desc.inverse:
        result = _forward(x, length, axis, desc.onesided)
    elif desc.onesided:  # a half spectrum back to a real signal
        result = np.fft.irfft(_as_complex(x), n=length, axis=axis)[..., np.newaxis]
    else:
        result = _as_pairs(np.fft.ifft(_as_complex(x), n=length, axis=axis))
    return result.astype(x.dtype)


def _frames(signal: np.ndarray, count: int, step: int, size: int) -> np.ndarray:
    """[batch, count, size, channels]: frames of ``size`` every ``step`` samples, the last
    zero-padded where it runs past the signal's end."""
    needed = (count - 1) * step + size
    padding = max(needed - signal.shape[1], 0)
    padded = np.pad(signal, ((0, 0), (0, padding), (0, 0)))
    starts = np.arange(count) * step
    return padded[:, starts[:, np.newaxis] + np.arange(size)]


@ref_kernel("STFT")
def stft(desc, signal, frame_step, window=None, frame_length=None):
    where = "STFT"
    if signal.ndim != 3:
        raise ShapeError(f"{where}: signal [batch, length, 1 or 2] expected, got shape {signal.shape}")
    if window is not None and window.ndim != 1:
        raise ShapeError(f"{where}: window [length] expected, got shape {window.shape}")
    step = count_value(frame_step, "frame_step", where, 1)
    length = count_value(frame_length, "frame_length", where, 1)
    if length is None:
        length = signal.shape[1] if window is None else window.shape[0]
    if window is None:
        window = np.ones((length,), dtype=signal.dtype)
    count = stft_frames(signal.shape[1], length, step)
    frames = _frames(signal, count, step, window.shape[0])
    weighted = frames * window.reshape(1, 1, -1, 1)
    return _forward(weighted, length, 2, desc.onesided).astype(signal.dtype)


def _window_steps(desc, size: np.ndarray, dtype=None) -> tuple[np.ndarray, np.ndarray]:
    """(0, 1, ..., size - 1) in ``dtype`` (default: the output's type where it is a float),
    and the divisor: the size input (periodic) or one less. Both as onnx's reference makes
    them, so that the products promote as there (the divisor is a 0-d integer array)."""
    count = count_value(size, "size", "window function", 0)
    assert count is not None  # an input's value is known when the kernel runs
    if dtype is None:
        dtype = desc.dtype.numpy if desc.dtype.numpy.kind == "f" else np.float64
    size = size.reshape(())
    return np.arange(count, dtype=dtype), size if desc.periodic else size - 1


@ref_kernel("HannWindow")
def hann_window(desc, size):
    steps, divisor = _window_steps(desc, size)
    with np.errstate(divide="ignore", invalid="ignore"):  # a symmetric window of 1: 0 / 0
        return (np.sin(steps * np.pi / divisor) ** 2).astype(desc.dtype.numpy)


@ref_kernel("HammingWindow")
def hamming_window(desc, size):
    steps, divisor = _window_steps(desc, size)
    alpha = 25.0 / 46.0
    with np.errstate(divide="ignore", invalid="ignore"):
        return (alpha - np.cos(steps * np.pi * 2 / divisor) * (1 - alpha)).astype(desc.dtype.numpy)


@ref_kernel("BlackmanWindow")
def blackman_window(desc, size):
    steps, divisor = _window_steps(desc, size, np.int64)  # the reference's are integers here
    with np.errstate(divide="ignore", invalid="ignore"):
        window = np.cos((steps * (np.pi * 2)) / divisor) * (-0.5)
        window += np.cos((steps * (np.pi * 4)) / divisor) * 0.08
    return (window + 0.42).astype(desc.dtype.numpy)


def _mel_edges(mel_bins: int, length: np.ndarray, sample_rate: np.ndarray, lower, upper) -> np.ndarray:
    """The spectrum bin of each triangle's left edge, centre and right edge (mel_bins + 2),
    evenly spaced on the mel scale, with the reference's spacing and rounding."""
    low_mel = 2595 * np.log1p(lower / 700) / np.log(10)
    high_mel = 2595 * np.log1p(upper / 700) / np.log(10)
    steps = np.arange(0, mel_bins + 2)
    mels = steps * ((high_mel - low_mel) / steps.shape[0]) + low_mel
    hertz = 700 * np.expm1(mels / 2595 * np.log(10))
    return (((length + 1) * hertz) // sample_rate).astype(int)


@ref_kernel("MelWeightMatrix")
def mel_weight_matrix(desc, num_mel_bins, dft_length_input, sample_rate, lower_edge, upper_edge):
    where = "MelWeightMatrix"
    mel_bins = count_value(num_mel_bins, "num_mel_bins", where, 1)
    length = count_value(dft_length_input, "dft_length", where, 1)
    rate = count_value(sample_rate, "sample_rate", where, 1)
    lower, upper = lower_edge.reshape(()), upper_edge.reshape(())
    check_mel_edges(float(lower), float(upper), rate)
    edges = _mel_edges(mel_bins, dft_length_input.reshape(()), sample_rate.reshape(()), lower, upper)
    left, centre, right = edges[:-2], edges[1:-1], edges[2:]
    bins = np.arange(length // 2 + 1)[:, np.newaxis]
    with np.errstate(divide="ignore", invalid="ignore"):  # empty sides select nothing
        rising = (bins - left) / (centre - left)
        falling = (right - bins) / (right - centre)
    weights = np.where((left <= bins) & (bins <= centre) & (centre > left), rising, 0.0)
    weights = np.where(bins == centre, 1.0, weights)  # the peak, also of a triangle without a left side
    weights = np.where((centre <= bins) & (bins < right), falling, weights)
    return weights.astype(desc.dtype.numpy)
