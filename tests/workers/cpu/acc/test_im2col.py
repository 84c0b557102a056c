"""im2col's column matrix against numpy slicing of the zero-padded input: every stride,
dilation and padding, blocks of rows and of pixels that start anywhere (mid output row too)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrt.workers.cpu.acc.conv.im2col import fill_columns


def _columns(x, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow):
    """The whole column matrix, by slicing the padded input."""
    channels, height, width = x.shape
    padded = np.zeros(
        (channels, ph + height + (kh - 1) * dh + oh * sh, pw + width + (kw - 1) * dw + ow * sw), np.float32
    )
    padded[:, ph : ph + height, pw : pw + width] = x
    rows = [
        padded[c, ki * dh : ki * dh + oh * sh : sh, kj * dw : kj * dw + ow * sw : sw][:oh, :ow].reshape(-1)
        for c in range(channels)
        for ki in range(kh)
        for kj in range(kw)
    ]
    return np.stack(rows)


@settings(max_examples=200, deadline=None)
@given(
    channels=st.integers(1, 3),
    height=st.integers(1, 12),
    width=st.integers(1, 12),
    kernel=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    strides=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    dilations=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    pads=st.tuples(st.integers(0, 3), st.integers(0, 3)),
    cut=st.tuples(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1)),
)
def test_fill_columns_matches_slices_of_the_padded_input(
    channels, height, width, kernel, strides, dilations, pads, cut
):
    (kh, kw), (sh, sw), (dh, dw), (ph, pw) = kernel, strides, dilations, pads
    oh = (height + 2 * ph - (kh - 1) * dh - 1) // sh + 1
    ow = (width + 2 * pw - (kw - 1) * dw - 1) // sw + 1
    if oh < 1 or ow < 1:
        return
    x = (
        np.random.default_rng(height * 13 + width)
        .standard_normal((channels, height, width))
        .astype(np.float32)
    )
    expected = _columns(x, kh, kw, sh, sw, dh, dw, ph, pw, oh, ow)
    geo = np.array([kh, kw, sh, sw, dh, dw, ph, pw, oh, ow], np.int64)
    # A block of rows r0:r1 for pixels q0:q1, as a chunk of a slice fills it.
    total_rows, pixels = expected.shape
    r0 = int(cut[0] * (total_rows - 1))
    r1 = r0 + 1 + int(cut[1] * (total_rows - r0 - 1))
    q0 = int(cut[2] * (pixels - 1))
    q1 = q0 + 1 + int(cut[3] * (pixels - q0 - 1))
    dst = np.full((r1 - r0, q1 - q0), np.nan, np.float32)
    fill_columns(x, x.reshape(channels, -1), 0, geo, r0, q0, dst)
    np.testing.assert_array_equal(dst, expected[r0:r1, q0:q1])
