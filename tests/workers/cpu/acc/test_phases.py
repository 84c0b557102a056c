"""The phase-plane fill that depthwise Conv and stacked pools share, against numpy slicing:
every parity of start and destination, odd and even plane widths, every stride."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrt.workers.cpu.acc.phases import fill_phase_planes


def _phase_planes(x, rows, pitch, sh, sw, ph, pw):
    """What fill_phase_planes must write, by numpy slicing of the padded plane (pad cells 0)."""
    height, width = x.shape
    padded = np.zeros((ph + max(height, rows * sh), pw + max(width, pitch * sw)), np.float32)
    padded[ph : ph + height, pw : pw + width] = x
    return np.stack([padded[i::sh, j::sw][:rows, :pitch] for i in range(sh) for j in range(sw)]).reshape(-1)


@settings(max_examples=150, deadline=None)
@given(
    height=st.integers(1, 17),
    width=st.integers(1, 17),
    sh=st.integers(1, 3),
    sw=st.integers(1, 3),
    ph=st.integers(0, 2),
    pw=st.integers(0, 2),
    cut=st.tuples(st.integers(0, 3), st.integers(0, 3)),
)
def test_fill_phase_planes_matches_strided_slices_of_the_padded_plane(height, width, sh, sw, ph, pw, cut):
    x = np.random.default_rng(height * 31 + width).standard_normal((height, width)).astype(np.float32)
    # Phase planes that cover the padded plane, or only its first rows and columns.
    rows = max(1, -(-(height + ph) // sh) - cut[0])
    pitch = max(1, -(-(width + pw) // sw) - cut[1])
    expected = _phase_planes(x, rows, pitch, sh, sw, ph, pw)
    # The planes sit behind an offset in a larger buffer, as a stack of several planes does.
    stride = rows * pitch + 3
    dst = np.zeros(5 + sh * sw * stride, np.float32)
    fill_phase_planes(dst[5:], x, rows, pitch, stride, sh, sw, ph, pw)
    got = dst[5:].reshape(sh * sw, stride)[:, : rows * pitch].reshape(-1)
    np.testing.assert_array_equal(got, expected)
    assert (dst[:5] == 0).all()
