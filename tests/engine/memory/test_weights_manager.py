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


def _mapped(path, data: np.ndarray) -> np.ndarray:
    """``data`` written to ``path`` and mapped back whole, as the cache of optimized networks
    maps its entries: a uint8 buffer whose views are the constants."""
    import mmap

    path.write_bytes(b"\0" * 64 + data.tobytes())
    with open(path, "rb") as f:
        return np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), np.uint8)


def test_lasting_transforms_of_a_kept_file_are_read_back_mapped_by_a_later_manager(tmp_path):
    weights = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
    calls = []

    def transform(source):
        def make():
            calls.append(1)
            return np.ascontiguousarray(source.reshape(64, 128).T * 2)

        return make

    made = []
    for _ in range(2):  # two processes: each its own manager and mapping of the file
        manager, buffer = WeightsManager(), _mapped(tmp_path / "entry", weights)
        manager.keep_on_disk(buffer, tmp_path / "forms")
        constant = buffer[64:].view(np.float32)
        made.append(manager.shared(constant, "t", ("layout", 8), transform(constant), lasting=True))
    assert len(calls) == 1  # the second read it back
    (kept,) = (tmp_path / "forms").iterdir()
    np.testing.assert_array_equal(made[1], weights.T * 2)
    assert not made[0].flags.writeable and not made[1].flags.writeable  # the same types either way
    assert isinstance(made[1].base, np.memmap)
    # other parameters or another place in the file: another transform
    manager.shared(constant, "t", ("layout", 16), transform(constant), lasting=True)
    manager.shared(buffer[128:].view(np.float32), "t", ("layout", 8), transform(constant), lasting=True)
    assert len(calls) == 3 and len(list((tmp_path / "forms").iterdir())) == 3
    assert kept.exists()


def test_only_lasting_transforms_of_kept_files_worth_a_file_are_written(tmp_path):
    buffer = _mapped(tmp_path / "entry", np.ones(8192, np.float32))
    manager = WeightsManager()
    constant = buffer[64:].view(np.float32)
    manager.shared(constant, "not-lasting", None, lambda: constant * 2)
    elsewhere = np.ones(8192, np.float32)  # not in a kept file
    manager.keep_on_disk(buffer, tmp_path / "forms")
    manager.shared(elsewhere, "t", None, lambda: elsewhere * 2, lasting=True)
    manager.shared(constant, "view", None, lambda: constant.reshape(64, 128), lasting=True)
    manager.shared(constant, "small", None, lambda: constant[:16] * 2, lasting=True)
    manager.shared(constant, "tuple", None, lambda: (constant * 2, constant * 3), lasting=True)
    assert not (tmp_path / "forms").exists()
    manager.shared(constant, "t", None, lambda: constant * 2, lasting=True)
    assert len(list((tmp_path / "forms").iterdir())) == 1


def test_an_unreadable_kept_transform_is_made_and_written_again(tmp_path):
    data = np.arange(8192, dtype=np.float32)

    def load(manager):
        buffer = _mapped(tmp_path / "entry", data)
        manager.keep_on_disk(buffer, tmp_path / "forms")
        constant = buffer[64:].view(np.float32)
        return manager.shared(constant, "t", None, lambda: constant + 1, lasting=True)

    load(WeightsManager())
    (kept,) = (tmp_path / "forms").iterdir()
    kept.write_bytes(kept.read_bytes()[:100])  # truncated
    np.testing.assert_array_equal(load(WeightsManager()), data + 1)
    np.testing.assert_array_equal(np.load(kept), data + 1)  # written whole again
