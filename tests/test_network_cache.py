"""The cache of optimized networks: a later load of the same ONNX file, optimized the same way,
reads the result back instead of parsing and optimizing; anything that changes the result
(the file, the network after its load, the backends, the options) is not served stale."""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys

import numpy as np
import onnx
import pytest
import trio
from onnx import TensorProto, helper

import flowrt
from flowrt import network_cache, network_cache_files


def _conv_model(seed: int) -> onnx.ModelProto:
    """x[1, 3, 8, 8] -> Conv 3x3 (+bias) -> BatchNormalization -> Relu -> y: random weights."""
    rng = np.random.default_rng(seed)
    init = [
        onnx.numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
        onnx.numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b"),
        onnx.numpy_helper.from_array(rng.uniform(0.5, 2, 8).astype(np.float32), "scale"),
        onnx.numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "shift"),
        onnx.numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "mean"),
        onnx.numpy_helper.from_array(rng.uniform(0.5, 2, 8).astype(np.float32), "var"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["n"], name="bn"),
        helper.make_node("Relu", ["n"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])],
        init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache that takes every network, however quick to optimize."""
    monkeypatch.setenv("FLOWRT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(network_cache.ENV, "1")
    monkeypatch.setattr(network_cache, "MIN_SECONDS", 0.0)
    monkeypatch.setattr(network_cache, "RACY_NS", 0)
    return tmp_path / "cache" / "networks"


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(_conv_model(0), path)
    return path


def _entries(cache) -> list:
    return sorted(cache.glob("*/*.flowrt"))


def _run(optimized, x: np.ndarray) -> np.ndarray:
    async def main():
        async with flowrt.Runtime() as rt:
            model = await rt.load(optimized)
            return (await model.run({"x": x}))["y"]

    return trio.run(main)


X = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)


def test_a_second_load_of_a_file_reads_its_optimized_network_back_without_parsing(cache, model_file, caplog):
    first = flowrt.optimize(flowrt.onnx.load(model_file), backends=["CpuRef"])
    assert len(_entries(cache)) == 1
    again = flowrt.onnx.load(model_file)
    assert not again.parsed  # the cache holds the file: nothing parsed yet
    with caplog.at_level(logging.INFO, logger="flowrt.network_cache"):
        second = flowrt.optimize(again, backends=["CpuRef"])
    assert not again.parsed
    assert "read from the cache" in caplog.text
    assert second.assignments() == first.assignments() and second.passes == first.passes
    (entry,) = _entries(cache)
    assert first.cached_from is None and second.cached_from == str(entry)
    assert f"read from the cache of optimized networks: {entry}" in second.report()  # flowrt inspect
    assert "read from the cache" not in first.report()
    np.testing.assert_array_equal(_run(second, X), _run(first, X))
    # The lazy network is a whole network when looked at: its graph parses the file.
    assert sorted(layer.kind for layer in again.graph) == [
        "BatchNormalization",
        "Constant",
        "Constant",
        "Constant",
        "Constant",
        "Constant",
        "Constant",
        "Conv",
        "Input",
        "Output",
        "Relu",
    ]
    assert again.parsed


def test_another_process_reads_the_cached_network_without_importing_onnx(cache, model_file):
    script = (
        "import sys, flowrt\n"
        "flowrt.network_cache.MIN_SECONDS = flowrt.network_cache.RACY_NS = 0\n"
        "opt = flowrt.optimize(flowrt.onnx.load(sys.argv[1]), backends=['CpuRef'])\n"
        "print(sorted(opt.assignments().items()), 'onnx' in sys.modules)\n"
    )
    env = dict(os.environ, FLOWRT_CACHE_DIR=str(cache.parent))
    runs = [
        subprocess.run(
            [sys.executable, "-c", script, str(model_file)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split(" ")
        for _ in range(2)
    ]
    assert runs[0][-1].strip() == "True"  # the first parses the file
    assert runs[1][-1].strip() == "False"  # the second reads the cache alone
    assert runs[0][:-1] == runs[1][:-1]
    assert len(_entries(cache)) == 1


def test_backends_and_options_key_the_entry(cache, model_file):
    ref = flowrt.optimize(flowrt.onnx.load(model_file), backends=["CpuRef"])
    acc = flowrt.optimize(flowrt.onnx.load(model_file), backends=["CpuAcc", "CpuRef"])
    options = flowrt.OptimizerOptions(fold_batch_norm=False)
    unfolded = flowrt.optimize(flowrt.onnx.load(model_file), backends=["CpuRef"], options=options)
    assert len(_entries(cache)) == 3
    assert set(ref.assignments().values()) == {"CpuRef"}
    assert "CpuAcc" in acc.assignments().values()
    assert "BatchNormalization" in [layer.kind for layer in unfolded.graph]
    again = flowrt.optimize(flowrt.onnx.load(model_file), backends=["CpuRef"], options=options)
    assert "BatchNormalization" in [layer.kind for layer in again.graph]
    np.testing.assert_allclose(_run(again, X), _run(ref, X), rtol=1e-5, atol=1e-5)


def test_a_file_written_again_is_optimized_again_and_its_former_entries_go(cache, model_file):
    before = _run(flowrt.optimize(flowrt.onnx.load(model_file), backends=["CpuRef"]), X)
    onnx.save(_conv_model(7), model_file)  # other weights, same size
    network = flowrt.onnx.load(model_file)
    assert network.graph is not None  # parsed now: the cache holds nothing of this file
    after = _run(flowrt.optimize(network, backends=["CpuRef"]), X)
    assert not np.allclose(before, after)
    expected = _run(flowrt.optimize(flowrt.onnx.load(model_file.read_bytes()), backends=["CpuRef"]), X)
    np.testing.assert_array_equal(after, expected)
    assert len(_entries(cache)) == 1


def test_a_network_changed_after_its_load_is_optimized_as_it_stands(cache, model_file):
    flowrt.optimize(flowrt.onnx.load(model_file), backends=["CpuRef"])
    network = flowrt.onnx.load(model_file)
    graph = network.graph
    relu = graph.layers["relu"]
    (out,) = [layer for layer in graph.output_layers]
    relu.outputs[0].disconnect(out.inputs[0])
    negate = network.add_layer("Neg", None, [relu])
    negate.outputs[0].connect(out.inputs[0])
    changed = flowrt.optimize(network, backends=["CpuRef"])
    assert "Neg" in [layer.kind for layer in changed.graph]
    assert np.all(_run(changed, X) <= 0)
    assert len(_entries(cache)) == 1  # not cached: the file alone no longer says what it is


def test_an_unreadable_entry_is_removed_and_the_network_optimized_again(cache, model_file, caplog):
    expected = _run(flowrt.optimize(flowrt.onnx.load(model_file), backends=["CpuRef"]), X)
    (entry,) = _entries(cache)
    entry.write_bytes(b"not a flowrt file at all")
    with caplog.at_level(logging.WARNING, logger="flowrt.network_cache"):
        again = flowrt.optimize(flowrt.onnx.load(model_file), backends=["CpuRef"])
    assert "unusable" in caplog.text
    np.testing.assert_array_equal(_run(again, X), expected)
    assert entry.read_bytes()[:8] != b"not a fl"  # written again


def test_turned_off_it_writes_nothing_and_parses_every_time(cache, model_file, monkeypatch):
    monkeypatch.setenv(network_cache.ENV, "0")
    flowrt.optimize(flowrt.onnx.load(model_file), backends=["CpuRef"])
    assert _entries(cache) == []


def test_networks_quick_to_optimize_are_not_kept(cache, model_file, monkeypatch):
    monkeypatch.setattr(network_cache, "MIN_SECONDS", 3600.0)
    flowrt.optimize(flowrt.onnx.load(model_file), backends=["CpuRef"])
    assert _entries(cache) == []


def test_past_its_size_the_least_recently_used_entries_go(cache, tmp_path, monkeypatch):
    paths = []
    for seed in range(3):
        path = tmp_path / f"model{seed}.onnx"
        onnx.save(_conv_model(seed), path)
        paths.append(path)
    flowrt.optimize(flowrt.onnx.load(paths[0]), backends=["CpuRef"])
    size = _entries(cache)[0].stat().st_size
    monkeypatch.setenv(network_cache_files.BYTES_ENV, str(2 * size))
    flowrt.optimize(flowrt.onnx.load(paths[1]), backends=["CpuRef"])
    (first,) = [e for e in _entries(cache) if e.stat().st_size == size][:1]
    os.utime(first, (0, 0))  # the least recently used
    flowrt.optimize(flowrt.onnx.load(paths[2]), backends=["CpuRef"])
    entries = _entries(cache)
    assert len(entries) == 2 and first not in entries


def test_a_lazy_network_pickles_as_the_network_it_stands_for(cache, model_file):
    flowrt.optimize(flowrt.onnx.load(model_file), backends=["CpuRef"])
    lazy = flowrt.onnx.load(model_file)
    copy = pickle.loads(pickle.dumps(lazy))
    assert type(copy) is flowrt.Network
    assert sorted(copy.graph.layers) == sorted(lazy.graph.layers)


def test_another_backend_than_flowrts_own_is_not_cached(cache, model_file):
    class Theirs(flowrt.RefBackend):
        """A third party's backend, much like CpuRef."""

    registry = flowrt.BackendRegistry()
    registry.register("Theirs", Theirs)
    registry.register("CpuRef", flowrt.RefBackend)
    flowrt.optimize(flowrt.onnx.load(model_file), backends=["Theirs", "CpuRef"], registry=registry)
    assert _entries(cache) == []
    flowrt.optimize(flowrt.onnx.load(model_file), backends=["CpuRef"], registry=registry)
    assert len(_entries(cache)) == 1  # flowrt's own, from a registry of its own


def test_a_file_changed_just_before_its_load_is_not_kept(cache, model_file, monkeypatch):
    monkeypatch.setattr(network_cache, "RACY_NS", 3600 * 10**9)
    optimized = flowrt.optimize(flowrt.onnx.load(model_file), backends=["CpuRef"])
    assert _entries(cache) == [] and optimized.assignments()


def test_a_file_changed_between_its_load_and_the_optimize_is_not_kept(cache, model_file):
    network = flowrt.onnx.load(model_file)
    onnx.save(_conv_model(3), model_file)
    flowrt.optimize(network, backends=["CpuRef"])
    assert _entries(cache) == []


def _model_with_overridable_bias(path) -> None:
    """The conv model, its bias also a graph input (an initializer a run may override), and
    a free batch dim."""
    model = _conv_model(5)
    model.graph.input.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [8]))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(model, path)


def test_a_second_session_on_a_file_parses_nothing_and_keeps_its_overridable_initializers(
    cache, tmp_path, caplog
):
    path = tmp_path / "bias.onnx"
    _model_with_overridable_bias(path)
    first = flowrt.InferenceSession(str(path), backends=["CpuRef"])
    with caplog.at_level(logging.INFO, logger="flowrt.network_cache"):
        second = flowrt.InferenceSession(str(path), backends=["CpuRef"])
    assert "read from the cache" in caplog.text
    assert not second._network.parsed
    got = [(i.name, i.shape, i.type) for i in second.get_overridable_initializers()]
    assert (
        got
        == [(i.name, i.shape, i.type) for i in first.get_overridable_initializers()]
        == [("b", [8], "tensor(float)")]
    )
    x = np.random.default_rng(2).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(second.run(None, {"x": x})[0], first.run(None, {"x": x})[0])
    bias = np.full(8, 3.0, np.float32)  # overridden: a variant with "b" as an input, cached too
    np.testing.assert_array_equal(
        second.run(None, {"x": x, "b": bias})[0], first.run(None, {"x": x, "b": bias})[0]
    )
    assert len(_entries(cache)) == 2
    first.close()
    second.close()


def test_a_session_with_free_dims_set_is_cached_apart(cache, tmp_path):
    path = tmp_path / "bias.onnx"
    _model_with_overridable_bias(path)
    free = flowrt.InferenceSession(str(path), backends=["CpuRef"])
    options = flowrt.SessionOptions()
    options.add_free_dimension_override_by_name("batch", 2)
    fixed = flowrt.InferenceSession(str(path), options, backends=["CpuRef"])
    again = flowrt.InferenceSession(str(path), options, backends=["CpuRef"])
    assert [i.shape for i in free.get_inputs()][0][0] == "batch"
    assert [i.shape for i in fixed.get_inputs()][0][0] == 2 == [i.shape for i in again.get_inputs()][0][0]
    assert len(_entries(cache)) == 2
    for session in (free, fixed, again):
        session.close()


def test_a_cache_directory_others_can_write_is_not_used(cache, model_file, caplog):
    cache.mkdir(parents=True)
    cache.chmod(0o777)  # anyone could plant an entry there
    with caplog.at_level(logging.WARNING, logger="flowrt.network_cache"):
        flowrt.optimize(flowrt.onnx.load(model_file), backends=["CpuRef"])
    assert _entries(cache) == []
    assert "not using the cache of optimized networks" in caplog.text and "writable by others" in caplog.text


def test_a_session_on_a_model_quick_to_optimize_leaves_nothing_behind(cache, tmp_path, monkeypatch):
    monkeypatch.setattr(network_cache, "MIN_SECONDS", 3600.0)
    path = tmp_path / "bias.onnx"
    _model_with_overridable_bias(path)
    session = flowrt.InferenceSession(str(path), backends=["CpuRef"])
    assert [i.name for i in session.get_overridable_initializers()] == ["b"]
    session.close()
    assert not cache.exists() or list(cache.rglob("*")) == []


def test_flowrt_inspect_says_when_the_network_came_from_the_cache(cache, model_file, capsys):
    from flowrt.cli import main

    assert main(["inspect", str(model_file), "--backends", "CpuRef"]) == 0
    assert "read from the cache" not in capsys.readouterr().out
    assert main(["inspect", str(model_file), "--backends", "CpuRef"]) == 0
    (entry,) = _entries(cache)
    assert f"read from the cache of optimized networks: {entry}" in capsys.readouterr().out


def test_a_cache_directory_that_cannot_be_made_costs_time_only(tmp_path, model_file, monkeypatch, caplog):
    blocker = tmp_path / "a file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("FLOWRT_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setenv(network_cache.ENV, "1")
    monkeypatch.setattr(network_cache, "MIN_SECONDS", 0.0)
    monkeypatch.setattr(network_cache, "RACY_NS", 0)
    with caplog.at_level(logging.INFO, logger="flowrt.network_cache"):
        optimized = flowrt.optimize(flowrt.onnx.load(model_file), backends=["CpuRef"])
    np.testing.assert_array_equal(
        _run(optimized, X),
        _run(flowrt.optimize(flowrt.onnx.load(model_file.read_bytes()), backends=["CpuRef"]), X),
    )
    assert [r.levelname for r in caplog.records if "not using the cache" in r.message] == ["INFO"]


def test_a_descriptor_replaced_after_the_load_counts_as_a_change(cache, model_file):
    import attrs

    flowrt.optimize(flowrt.onnx.load(model_file), backends=["CpuRef"])
    network = flowrt.onnx.load(model_file)
    conv = network.graph.layers["conv"]
    for _ in range(3):  # equal values, other objects (the first ones freed meanwhile)
        conv.descriptor = attrs.evolve(conv.descriptor)
    again = flowrt.optimize(network, backends=["CpuRef"])
    assert again.cached_from is None
    assert len(_entries(cache)) == 1


def _wide_conv_model(seed: int) -> onnx.ModelProto:
    """x[1, 32, 28, 28] -> Conv 3x3 to 64 channels -> Conv 1x1 to 128 -> y: weights CpuAcc
    runs in forms of their own (Winograd transforms, panels), each worth a file."""
    rng = np.random.default_rng(seed)
    init = [
        onnx.numpy_helper.from_array(rng.standard_normal((64, 32, 3, 3)).astype(np.float32), "w1"),
        onnx.numpy_helper.from_array(rng.standard_normal((128, 64, 1, 1)).astype(np.float32), "w2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c"], name="conv3", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c", "w2"], ["y"], name="conv1"),
    ]
    graph = helper.make_graph(
        nodes,
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 28, 28])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 128, 28, 28])],
        init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_the_transformed_weights_of_a_cached_network_are_kept_beside_it_for_later_loads(
    cache, tmp_path, monkeypatch
):
    from flowrt.engine.memory import weights

    path = tmp_path / "wide.onnx"
    onnx.save(_wide_conv_model(0), path)
    x = np.random.default_rng(2).standard_normal((1, 32, 28, 28)).astype(np.float32)
    written = []
    write = weights._write_lasting
    monkeypatch.setattr(weights, "_write_lasting", lambda *a: (written.append(a[0]), write(*a)))
    backends = ["CpuAcc", "CpuRef"]
    expected = _run(flowrt.optimize(flowrt.onnx.load(path.read_bytes()), backends=backends), x)
    first = _run(flowrt.optimize(flowrt.onnx.load(path), backends=backends), x)  # stores the entry
    assert written == []  # its constants are not the entry's
    (entry,) = _entries(cache)
    forms = network_cache_files.forms_folder(entry)
    second = _run(flowrt.optimize(flowrt.onnx.load(path), backends=backends), x)  # maps it
    kept = sorted(forms.iterdir())
    assert kept and sorted(written) == kept
    third = _run(flowrt.optimize(flowrt.onnx.load(path), backends=backends), x)  # reads them back
    assert sorted(written) == kept  # nothing made again
    for result in (first, second, third):
        np.testing.assert_array_equal(result, expected)
    # an entry found unusable goes with its transformed weights
    entry.write_bytes(b"not a flowrt file at all")
    again = _run(flowrt.optimize(flowrt.onnx.load(path), backends=backends), x)
    np.testing.assert_array_equal(again, expected)
    assert not forms.exists()
    # a file written again: the former file's entries and their folders go
    _run(flowrt.optimize(flowrt.onnx.load(path), backends=backends), x)
    assert forms.exists()
    onnx.save(_wide_conv_model(1), path)
    _run(flowrt.optimize(flowrt.onnx.load(path), backends=backends), x)
    assert [p.suffix for p in entry.parent.iterdir()] == [".flowrt"]


def test_the_load_that_writes_an_entrys_transformed_weights_makes_room_for_them_first(
    cache, tmp_path, monkeypatch
):
    backends = ["CpuAcc", "CpuRef"]
    paths, entries = [], []
    for seed in range(2):
        path = tmp_path / f"wide{seed}.onnx"
        onnx.save(_wide_conv_model(seed), path)
        flowrt.optimize(flowrt.onnx.load(path), backends=backends)  # stores its entry
        (entry,) = set(_entries(cache)) - set(entries)
        paths.append(path)
        entries.append(entry)
    first, second = entries
    os.utime(second, (0, 0))  # the least recently used
    both = first.stat().st_size + second.stat().st_size
    monkeypatch.setenv(network_cache_files.BYTES_ENV, str(both))  # both fit, without forms
    x = np.random.default_rng(2).standard_normal((1, 32, 28, 28)).astype(np.float32)
    _run(flowrt.optimize(flowrt.onnx.load(paths[0]), backends=backends), x)  # writes the forms
    assert first.exists() and not second.exists()  # room made for them first
    assert any(network_cache_files.forms_folder(first).iterdir())
