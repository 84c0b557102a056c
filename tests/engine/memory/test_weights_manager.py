"""The weights manager on its own: one transform per constant while it is held, keyed by the
constant (not by an address a later array may reuse), counted per load as own or shared."""

import gc

import attrs
import numpy as np

from flowrt.engine.memory.weights import WeightsManager, WeightsRecord, recording


def test_one_transform_per_constant_and_name_while_held():
    manager, calls = WeightsManager(), []
    source = np.arange(12, dtype=np.float32)

    def make():
        calls.append(1)
        return source * 2

    first = manager.shared(source, "double", None, make)
    again = manager.shared(source, "double", None, make)
    assert again is first and len(calls) == 1
    other = manager.shared(source, "double", 3, make)  # other parameters: another form
    assert other is not first and len(calls) == 2
    view = manager.shared(source[:6], "double", None, make)  # another view: another constant
    assert view is not first and len(calls) == 3
    np.testing.assert_array_equal(first, source * 2)


def test_a_form_nobody_holds_is_made_again():
    manager = WeightsManager()
    source = np.ones(8, np.float32)
    first = manager.shared(source, "t", None, lambda: source + 1)
    assert manager.held_bytes() == first.nbytes and len(manager) == 1
    del first
    gc.collect()
    assert manager.held_bytes() == 0 and len(manager) == 0
    assert manager.shared(source, "t", None, lambda: source + 5)[0] == 6


def test_a_freed_constant_forgets_its_forms_even_if_its_address_is_reused():
    manager = WeightsManager()
    kept = []
    for value in (1.0, 2.0, 3.0):
        source = np.full(1024, value, np.float32)  # the allocator may hand out the same address
        form = manager.shared(source, "copy", None, source.copy)
        assert form[0] == value  # never a form of an earlier, freed constant
        kept.append(form)
        del source
        gc.collect()


def test_tuples_and_attrs_values_and_what_a_load_counts():
    @attrs.frozen(eq=False)
    class Packed:
        panels: np.ndarray
        size: int

    manager = WeightsManager()
    source = np.zeros((4, 4), np.float32)
    record = WeightsRecord()
    with recording(record, "CpuAcc"):
        pair = manager.shared(source, "pair", None, lambda: (np.ones(3), np.ones(5)))
        packed = manager.shared(source, "packed", None, lambda: Packed(np.ones(7, np.int8), 7))
        view = manager.shared(source, "view", None, lambda: source.reshape(-1))  # no bytes of its own
    assert record.own == {"CpuAcc": 3 * 8 + 5 * 8 + 7} and record.shared == {}
    again = WeightsRecord()
    with recording(again, "CpuAcc"):
        found = manager.shared(source, "pair", None, lambda: (np.zeros(3), np.zeros(5)))
        assert all(a is b for a, b in zip(found, pair, strict=True))
        assert manager.shared(source, "packed", None, lambda: Packed(np.zeros(7, np.int8), 7)) is packed
        assert manager.shared(source, "view", None, lambda: source.reshape(-1)) is view
    assert again.own == {} and again.shared == {"CpuAcc": 3 * 8 + 5 * 8 + 7}
