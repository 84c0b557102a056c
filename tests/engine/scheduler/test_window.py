"""Window splits never overlap and cover the window exactly (property test)."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrt.engine.scheduler.window import Dimension, SplitHint, Window, split


def _points(window: Window) -> set[tuple[int, ...]]:
    return set(itertools.product(*(range(d.start, d.end, d.step) for d in window.dims)))


@st.composite
def _windows(draw):
    rank = draw(st.integers(1, 3))
    dims = []
    for _ in range(rank):
        start = draw(st.integers(0, 5))
        length = draw(st.integers(0, 17))
        dims.append(Dimension(start, start + length, draw(st.integers(1, 4))))
    return Window(dims)


@settings(max_examples=300, deadline=None)
@given(_windows(), st.data(), st.integers(1, 9), st.integers(1, 6))
def test_slices_cover_the_window_exactly_and_never_overlap(window, data, workers, min_slice):
    axis = data.draw(st.integers(0, len(window.dims) - 1))
    slices = split(window, SplitHint(axis, min_slice), workers)
    assert 1 <= len(slices) <= workers
    covered = [_points(s) for s in slices]
    assert set().union(*covered) == _points(window)
    assert sum(len(c) for c in covered) == len(_points(window))
    sizes = [s.dims[axis].iterations for s in slices]
    if len(slices) > 1:
        assert min(sizes) >= min_slice
        assert max(sizes) - min(sizes) <= 1
    for s in slices:
        for other_axis, dim in enumerate(s.dims):
            if other_axis != axis:
                assert dim == window.dims[other_axis]


def test_too_small_a_window_is_not_split():
    window = Window.of_shape((1, 8, 3))
    assert split(window, SplitHint(axis=1, min_slice=5), workers=4) == [window]
    assert len(split(window, SplitHint(axis=1, min_slice=4), workers=4)) == 2


def test_bad_windows_fail_where_they_are_made():
    with pytest.raises(ValueError, match="step must be at least 1"):
        Dimension(0, 4, 0)
    with pytest.raises(ValueError, match="end 2 is before its start 3"):
        Dimension(3, 2)
    with pytest.raises(ValueError, match="min_slice must be at least 1"):
        SplitHint(0, 0)
