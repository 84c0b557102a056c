"""Seeded fuzzing of GpuAcc's tuning files: mutated copies of a real one go through
``Runtime(tuning_file=..., tuning_mode="none")``, ``rt.load`` and ``run``.

Every failure must be a ``flowrt.errors`` error whose message names the file; no case may
take more than 10 s; and a mutated file that loads must give CpuRef's outputs (a local work
size changes how work is grouped, never what is computed). Mutations are byte-level (as
``fuzzmodels``: flips, cuts, insertions, deletions) one time in three, else on the decoded
msgpack document: a field of an entry or of the map set to another type, a negative, zero,
huge or NaN size, keys dropped or duplicated. 50 cases in CI; ``-m slow`` runs 2,000.
"""

from __future__ import annotations

import collections
import threading
import time

import msgpack
import numpy as np
import pytest
import trio
from fuzzmodels import BYTE_MUTATIONS, Mutation, pick

import flowrt
from flowrt.errors import BackendError, FlowrtError
from flowrt.workers.gpu.device import cl
from flowrt.workers.gpu.tuner import Tuner

CASES = 50
SLOW_CASES = 2000
CASE_LIMIT_S = 10.0

STRANGE_SIZES = (0, -1, -(2**63), 1, 3, 7, 4096, 4097, 2**31, 2**40, 2**64 - 1, 1.5, float("nan"))
STRANGE_VALUES = (
    *STRANGE_SIZES,
    float("inf"),
    None,
    True,
    "",
    "64",
    "\u00e9\u4e2d",
    b"\x00bin",
    [],
    [64, 64, 64, 64],
    [[64]],
    {"k": 1},
)


# -- msgpack-level mutations: the document decoded, changed, encoded again -----------------------------
def _entry(doc: dict, rng: np.random.Generator) -> list | None:
    """A random entry still shaped as one (an earlier mutation may have broken them all), or None."""
    entries = doc.get("entries")
    shaped = [e for e in entries if isinstance(e, list) and len(e) == 5] if isinstance(entries, list) else []
    return pick(rng, shaped) if shaped else None


def _entry_field(doc: dict, rng: np.random.Generator) -> str:
    entry, field = _entry(doc, rng), int(rng.integers(0, 5))
    if entry is None:
        return _top_level(doc, rng)
    entry[field] = pick(rng, STRANGE_VALUES)
    return f"entry field {field} = {entry[field]!r:.40}"


def _size(doc: dict, rng: np.random.Generator) -> str:
    entry, field = _entry(doc, rng), int(rng.integers(3, 5))
    if entry is None:
        return _top_level(doc, rng)
    entry[field] = [pick(rng, STRANGE_SIZES)]
    return f"{'global' if field == 3 else 'local'} size = {entry[field]!r:.40}"


def _entry_shape(doc: dict, rng: np.random.Generator) -> str:
    entry, choice = _entry(doc, rng), int(rng.integers(0, 4))
    if entry is None:
        return _top_level(doc, rng)
    entries = doc["entries"]
    if choice == 0:
        del entry[int(rng.integers(0, 5))]
    elif choice == 1:
        entry.append(pick(rng, STRANGE_VALUES))
    elif choice == 2:
        entries.append([*entry[:4], [pick(rng, STRANGE_SIZES)]])  # the same key again, another size
    else:
        entries[entries.index(entry)] = pick(rng, STRANGE_VALUES)
    return f"entry {entry!r:.60} reshaped ({choice})"


def _top_level(doc: dict, rng: np.random.Generator) -> str:
    key = pick(rng, ["format", "version", "entries", "extra"])
    if rng.random() < 0.3:
        doc.pop(key, None)
        return f"key {key!r} dropped"
    doc[key] = pick(rng, STRANGE_VALUES)
    return f"{key} = {doc[key]!r:.40}"


DOCUMENT_MUTATIONS = (_entry_field, _size, _size, _entry_shape, _top_level)


def _pack_map_with_duplicate(doc: dict, rng: np.random.Generator) -> Mutation:
    """The map written with one key twice (a msgpack map may say so; a dict cannot)."""
    pairs = list(doc.items())
    pairs.insert(int(rng.integers(0, len(pairs) + 1)), (pick(rng, list(doc)), pick(rng, STRANGE_VALUES)))
    body = b"".join(msgpack.packb(k) + msgpack.packb(v) for k, v in pairs)
    return bytes([0x80 | len(pairs)]) + body, f"duplicate key, {len(pairs)} pairs"


def mutate_tuning_file(original: bytes, rng: np.random.Generator) -> Mutation:
    """A byte-level mutation one time in three, else one or two document mutations (or a
    duplicated key) re-encoded."""
    if rng.random() < 1 / 3:
        return pick(rng, BYTE_MUTATIONS)(original, rng)
    doc = msgpack.unpackb(original)
    if rng.random() < 0.1:
        return _pack_map_with_duplicate(doc, rng)
    done = [pick(rng, DOCUMENT_MUTATIONS)(doc, rng) for _ in range(int(rng.integers(1, 3)))]
    return msgpack.packb(doc), "; ".join(done)


# -- running one case ------------------------------------------------------------------------------------
async def _load_and_run(path, optimized, feeds) -> dict[str, np.ndarray]:
    async with flowrt.Runtime(cpu_workers=1, tuning_file=path, tuning_mode="none") as rt:
        model = await rt.load(optimized, max_in_flight=1)
        return await model.run(feeds)


def _run_case(path, optimized, feeds) -> tuple[str, object]:
    """("ran", outputs), ("raised", the exception) or ("hung", None): the case runs in its own
    thread (its own trio loop), joined with a time limit, so that a blocking call is caught too."""
    result: list = []

    def target() -> None:
        try:
            result.append(("ran", trio.run(_load_and_run, path, optimized, feeds)))
        except BaseException as e:  # reported by the caller, whatever it is
            result.append(("raised", e))

    thread = threading.Thread(target=target, name="tuning-fuzz-case", daemon=True)
    thread.start()
    thread.join(CASE_LIMIT_S)
    return result[0] if result else ("hung", None)


def _problem(path, outcome: str, value, expected: dict) -> str:
    """An empty string when the case behaved, else what went wrong."""
    if outcome == "hung":
        return f"no answer within {CASE_LIMIT_S} s"
    if outcome == "ran":
        try:
            np.testing.assert_allclose(value["y"], expected["y"], rtol=1e-5, atol=1e-6)
        except AssertionError as e:
            return f"silent wrong output: {str(e)[:300]}"
        return ""
    if not isinstance(value, FlowrtError):
        return f"raised {type(value).__name__}: {str(value)[:300]}"
    if str(path) not in str(value):
        return f"{type(value).__name__} does not name the file: {str(value)[:300]}"
    return ""


def fuzz_tuning_files(original: bytes, directory, network, feeds, expected, count: int, seed: int):
    """Run ``count`` mutated cases; returns (problems, outcome counts, (seconds, case) of the slowest)."""
    problems: list[str] = []
    outcomes: collections.Counter = collections.Counter()
    slowest = (0.0, "")
    path = directory / "mutated.msgpack"
    optimized = flowrt.optimize(network(), backends=["GpuAcc"])
    for index in range(count):
        data, what = mutate_tuning_file(original, np.random.default_rng([seed, index]))
        path.write_bytes(data)
        start = time.monotonic()
        outcome, value = _run_case(path, optimized, feeds)
        elapsed = time.monotonic() - start
        outcomes[outcome if outcome != "raised" else type(value).__name__] += 1
        problem = _problem(path, outcome, value, expected)
        if problem:
            problems.append(f"case {index} ({what}): {problem}")
        if outcome == "hung":
            break  # its thread still holds the device's queues: later cases would tell nothing
        slowest = max(slowest, (elapsed, f"case {index} ({what[:120]})"))
    return problems, outcomes, slowest


def _check(result) -> collections.Counter:
    problems, outcomes, slowest = result
    print(f"\ntuning files: {dict(sorted(outcomes.items()))}; slowest {slowest[1]}: {slowest[0]:.2f} s")
    assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems[:20])
    return outcomes


@pytest.fixture(scope="module")
def tuning_file(gpu, conv_network, tmp_path_factory) -> bytes:
    """The bytes of a tuning file of the ``conv_network`` CNN, tuned here in rapid mode."""
    path = tmp_path_factory.mktemp("tuning") / "conv.msgpack"

    async def tune() -> None:
        async with flowrt.Runtime(cpu_workers=1, tuning_file=path, tuning_mode="rapid") as rt:
            await rt.load(flowrt.optimize(conv_network(), backends=["GpuAcc"]))

    trio.run(tune)
    data = path.read_bytes()
    assert len(msgpack.unpackb(data)["entries"]) >= 3  # enough entries for the mutations to pick from
    return data


def _fuzz(tuning_file, tmp_path, conv_network, conv_net_reference, count: int, seed: int):
    feeds, expected = conv_net_reference
    return fuzz_tuning_files(tuning_file, tmp_path, conv_network, feeds, expected, count, seed)


def test_local_size_past_the_device_limit_fails_at_runtime_start_naming_file_and_entry(
    gpu, tuning_file, tmp_path, conv_network, conv_net_reference
):
    doc = msgpack.unpackb(tuning_file)
    entry = doc["entries"][0]
    entry[4] = [int(gpu.device.max_work_group_size) + 1]
    path = tmp_path / "too_large.msgpack"
    path.write_bytes(msgpack.packb(doc))
    outcome, error = _run_case(path, flowrt.optimize(conv_network(), ["GpuAcc"]), conv_net_reference[0])
    assert outcome == "raised" and isinstance(error, BackendError), (outcome, error)
    assert str(path) in str(error) and repr(entry) in str(error)
    assert f"expected a local size of at most [{entry[4][0] - 1}]" in str(error)


class _RefusingKernel:
    """A kernel whose own work-group limit is below every size (as a real GPU's may be)."""

    function_name = "scale"

    def __call__(self, queue, global_size, local_size, *args):
        raise cl.LogicError("clEnqueueNDRangeKernel failed: INVALID_WORK_GROUP_SIZE")


class _Device:
    name, driver_version, int_ptr = "GPU", "1.0", 1


def test_tuned_size_the_kernel_refuses_raises_backend_error_naming_the_entry(gpu):
    tuner = Tuner()
    tuner.entries[("GPU", "1.0", "scale", (100,))] = (512,)
    with pytest.raises(BackendError, match=r"entry \['GPU', '1.0', 'scale', \[100\], \[512\]\] has a local"):
        tuner.enqueue(_RefusingKernel(), object(), _Device(), 100, ())
    with pytest.raises(cl.LogicError):  # an untuned launch's own error is not the file's fault
        tuner.enqueue(_RefusingKernel(), object(), _Device(), 101, ())


def test_mutated_tuning_files_fail_with_flowrt_errors_or_run_right(
    tuning_file, tmp_path, conv_network, conv_net_reference
):
    outcomes = _check(_fuzz(tuning_file, tmp_path, conv_network, conv_net_reference, CASES, seed=4))
    assert outcomes["ran"] and outcomes["BackendError"]  # both paths were taken


@pytest.mark.slow
def test_2000_mutated_tuning_files(tuning_file, tmp_path, conv_network, conv_net_reference):
    _check(_fuzz(tuning_file, tmp_path, conv_network, conv_net_reference, SLOW_CASES, seed=103))
