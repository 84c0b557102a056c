"""A CpuAcc layer's launches recorded once per memory pool, then replayed with no Python.

A small conv costs 15-25 us of Python per call (its plan looked up, its argument tuple built,
numba unboxing that tuple) around a kernel of a few microseconds, and that Python holds the
GIL: two runs in flight on two cores wait for each other there. A memory pool's tensors never
move, so every launch a layer makes in the pool (``calls.run_tasks`` and ``run_stages``: the
slice function, its task count and its argument tuple) is the same in every run. Recorded
once, each launch is a row ``(entry, tasks, step, data)`` — what ``_parallel_tasks`` is called
with, its data (the arguments, arrays borrowed) kept in an int64 buffer — and a run replays the
rows through :func:`replay`: one numba call, the GIL released for all of it.

A layer is recorded (``AccWorkload.bind``) only when replaying is proven to do what running
does: on arrays of its own, the layer runs on random inputs and is recorded; then on new random
inputs its recording replayed must give the bits running it gives. A kernel doing any work outside its
launches (numpy in Python, a numba call of its own) fails that and stays a Python step. Nor is
one recorded whose launches would keep more than ``MAX_KEPT_BYTES`` of buffers besides the
layer's inputs and outputs (a big conv's column buffer would stay allocated for the pool's
life; read-only forms of its constants, its packed weights, do not count: the load holds
them anyway), or whose work is long enough that its Python does not count (``MAX_WORK_S``, and
``MAX_TENSOR_BYTES`` of tensors, which are not even tried). A
kernel that splits its work is recorded twice: as a lone run splits it (every worker) and as
a run with one thread does (a run sharing the cores replays that one); where either cannot be
recorded, the layer is not.

Consecutive recorded layers of a segment replay as one step: one numba call for the chain
(:func:`replay_layers`), where each layer was a step with its own Python around it, which
needs the GIL: beside a thread that holds it (a server's event loop, a stream's batching),
each step waited for it, and a squeezenet run of 17 steps took twice its time. A run's
checks between its layers (whether it was cancelled, whether a HIGH run asks it to pause,
how many threads it has now) are made in the call: between two layers it looks at its job's
signal (``worker_thread.job_signal``), which the worker pool sets when one of them changes,
and comes back to Python for it (``worker_thread.attend``) only then, going on from the next
layer.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import numpy as np
from numba import njit, types

from flowrt.workers.cpu.acc import calls, team
from flowrt.workers.cpu.acc.calls import RECORDING, launch_recorded
from flowrt.workers.cpu.worker_thread import attend, job_context, job_signal

logger = logging.getLogger(__name__)

RECORD_WORDS = 1024  # a launch's record: entry, length, then up to 8 KiB of data
MAX_KEPT_BYTES = 128 << 10
MAX_WORK_S = 2e-3
# While another process keeps the cores busy (``team.CONTENDED``), a recorded layer whose work
# took less than this alone runs as a run of one thread does: no region, no helper to wake.
# Beside one busy process, squeezenet's layers (30-250 us) ran faster so (busy 4.7-4.8 ms ->
# 4.3-4.5), resnet50's (150-1500 us) no slower with their helper.
CONTENDED_SPLIT_S = 200e-6
# Layers moving more than this (non-constant inputs and outputs) are not tried: their work
# dwarfs their Python, and checking them would copy their tensors (a peak of its own).
MAX_TENSOR_BYTES = 4 << 20
# The types of the inputs that are proven on random values (quantized layers take 8-bit
# integers); layers with others (integer indices, whose random values fail) are not tried.
PROVEN_TYPES = (np.dtype(np.float32), np.dtype(np.uint8), np.dtype(np.int8))
PROVE: Any = object()  # record's default: prove the layer there


@njit(nogil=True, cache=True)
def replay(rows):
    """Run recorded launches in order: each row ``(entry, tasks, step, data address)``."""
    for i in range(rows.shape[0]):
        launch_recorded(rows[i, 0], rows[i, 1], rows[i, 2], rows[i, 3])


@njit(nogil=True, cache=True)
def replay_layers(rows, starts, at, signal):
    """Run the recorded launches of layers ``at`` onwards (layer ``i``'s are rows
    ``starts[i]`` to ``starts[i + 1]``) until ``signal[0]`` is found set before a layer after
    the first: the index of the first layer not run, or the count of layers."""
    layers = starts.shape[0] - 1
    for layer in range(at, layers):
        if layer > at and signal[0] != 0:
            return layer
        for i in range(starts[layer], starts[layer + 1]):
            launch_recorded(rows[i, 0], rows[i, 1], rows[i, 2], rows[i, 3])
    return layers


def _table(units: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Consecutive layers' rows as one table, and where each layer's begin (and the last ends)."""
    starts = np.zeros(len(units) + 1, np.int64)
    np.cumsum([unit.shape[0] for unit in units], out=starts[1:])
    return np.concatenate(units), starts


class Recorder:
    """The launches recorded while it is open on a thread (:func:`recording`)."""

    def __init__(self) -> None:
        self.launches: list[tuple[np.ndarray, int, int]] = []  # (record, tasks, step)
        self.keep: list[Any] = []  # the argument tuples whose arrays the records point into
        self.failed = False

    @staticmethod
    def buffer() -> np.ndarray:
        """An empty record for one launch."""
        return np.zeros(RECORD_WORDS, np.int64)

    def add(self, record: np.ndarray, tasks: int, steps: int, args: tuple) -> None:
        if tasks <= 0:
            return
        if record[0] == 0:  # its data did not fit
            self.failed = True
            return
        kept = record[: 2 + record[1]].copy()
        self.keep.append(args)
        self.launches += [(kept, tasks, step) for step in range(steps)]

    def add_stages(self, steps: int, *stages: tuple[np.ndarray, int, tuple]) -> None:
        kept = []
        for record, tasks, args in stages:
            if tasks > 0:
                if record[0] == 0:
                    self.failed = True
                    return
                kept.append((record[: 2 + record[1]].copy(), tasks))
                self.keep.append(args)
        self.launches += [(record, tasks, step) for step in range(steps) for record, tasks in kept]

    def table(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """The rows :func:`replay` takes, and the records their data addresses point into."""
        records = [record for record, _, _ in self.launches]
        rows = [
            (int(record[0]), tasks, step, record.ctypes.data + 16) for record, tasks, step in self.launches
        ]
        return np.array(rows, np.int64).reshape(-1, 4), records


@contextlib.contextmanager
def recording() -> Iterator[Recorder]:
    """Record this thread's launches, instead of running them, while open."""
    recorder = Recorder()
    previous, RECORDING.recorder = RECORDING.recorder, recorder
    try:
        yield recorder
    finally:
        RECORDING.recorder = previous


class Launches:
    """Compiles consecutive recorded layers' bound calls into one call of
    :func:`replay_layers`, on the rows recorded for one thread when the run has one thread now,
    on those for one thread of its short layers while another process keeps the cores busy
    (where a helper woken for a short region cost more than it saved), else on the lone
    run's."""

    @staticmethod
    def compile(bound: Sequence[Any]) -> Callable[[], None]:
        """One call for ``bound``: recorded layers (:class:`LaunchCall`) and runs of the tape's
        bound calls (``tape.BoundCall``), each kind giving its rows (``replay_rows``), a unit of
        rows for each layer or tape."""
        every, one, shared, keep = [], [], [], []
        for _, group in itertools.groupby(bound, key=type):
            calls = list(group)
            rows, one_rows, shared_rows, kept = calls[0].replay_rows(calls)
            every += rows
            one += one_rows
            shared += shared_rows
            keep.append(kept)
        lone, one_thread, contended = _table(every), _table(one), _table(shared)
        if lone[0].shape[0] == 0:  # views only
            return lambda: None
        layers = len(every)
        control = team.CONTROL

        def run() -> None:
            signal, at = job_signal(), 0
            while True:
                job = job_context()
                if job is not None and job.threads == 1:
                    rows, starts = one_thread
                else:
                    rows, starts = contended if control[team.CONTENDED] else lone
                at = replay_layers(rows, starts, at, signal)
                if at == layers or not attend():
                    return

        run.keep = (tuple(bound), keep)  # type: ignore[attr-defined]  # alive with the call
        return run


# The program of every recorded layer and of the tape's bound calls: consecutive ones share a
# step.
LAUNCHES = Launches()


@attrs.frozen(eq=False)
class LaunchCall:
    """A recorded layer, as ``AccWorkload.bind`` returns it; ``seconds``: its work, as its
    proof timed it."""

    outputs: tuple[np.ndarray, ...]
    rows: np.ndarray
    records: list[np.ndarray]
    keep: list[Any]
    seconds: float
    program: Any = LAUNCHES
    # The layer's launches as a run with one thread makes them (its split planned for one),
    # where that differs: a run sharing the cores replays those.
    one_thread: LaunchCall | None = None

    @staticmethod
    def replay_rows(
        calls: Sequence[LaunchCall],
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[Any]]:
        """``Launches.compile``'s rows for consecutive recorded layers (tables to join): as a
        lone run makes them, as a run of one thread does, and while another process keeps
        the cores busy (``team.CONTENDED``): a layer shorter than ``CONTENDED_SPLIT_S`` as one
        thread makes it, the others as a lone run."""
        one = [(call.one_thread or call).rows for call in calls]
        shared = [o if call.seconds < CONTENDED_SPLIT_S else call.rows for call, o in zip(calls, one)]
        return [call.rows for call in calls], one, shared, list(calls)


def _arrays(value: Any) -> Iterator[np.ndarray]:
    if isinstance(value, np.ndarray):
        yield value
    elif isinstance(value, tuple):
        for item in value:
            yield from _arrays(item)


def _kept_bytes(keep: list[Any], mine: Sequence[np.ndarray]) -> int:
    """Bytes of the arrays the records point into besides ``mine`` (inputs, outputs) and
    read-only ones: forms of the layer's constants (packed weights), which the load holds
    anyway, shared through the weights manager; a buffer a kernel allocates to write into
    (columns, packed pixels) is writable."""
    seen: set[int] = set()
    total = 0
    for array in _arrays(tuple(keep)):
        if not array.flags.writeable or any(np.may_share_memory(array, m) for m in mine):
            continue
        owner = array
        while isinstance(owner.base, np.ndarray):
            owner = owner.base
        if id(owner) not in seen:
            seen.add(id(owner))
            total += owner.nbytes
    return total


_random: list[np.ndarray] = []
_FLOAT32 = np.dtype(np.float32)


def _random_values(size: int, second: bool, dtype: np.dtype = _FLOAT32) -> np.ndarray:
    """``size`` values of ``dtype`` (float32 in [-1, 1), or any 8-bit integer), one of two
    sets that differ at every position: slices of one buffer made once per process (a draw
    per validation cost more than the layer's runs)."""
    if not _random:
        values = np.random.default_rng(1).random(MAX_TENSOR_BYTES // 4 + 1, dtype=np.float32)
        values *= 2
        values -= 1
        _random.append(values)
    if dtype == np.float32:
        return _random[0][int(second) : int(second) + size]
    first = _random[0].view(np.uint8)[:size]  # the floats' bytes: no pattern a kernel could miss
    return (first ^ np.uint8(0x55) if second else first).view(dtype)


def _replays_exactly(execute, inputs: Sequence[Any], constant: Sequence[bool], outputs) -> float | None:
    """The seconds a run of ``execute`` took, where replaying its recorded launches gives what
    running it does, on arrays of its own: recorded on one set of random inputs, replayed on
    another, within ``MAX_WORK_S`` per run; None where it does not."""
    mine_in = [x if x is None or fixed else np.empty(x.shape, x.dtype) for x, fixed in zip(inputs, constant)]
    mine_out = [np.empty(o.shape, o.dtype) for o in outputs]
    free = [x for x, fixed in zip(mine_in, constant) if x is not None and not fixed]

    def fill(second: bool) -> None:
        for x in free:
            x.reshape(-1)[...] = _random_values(x.size, second, x.dtype)

    fill(False)
    for _ in range(2):  # again when the first took long: it may have compiled or planned
        start = time.perf_counter()
        execute(mine_in, mine_out)
        seconds = time.perf_counter() - start
        if seconds <= MAX_WORK_S:
            break
    else:
        return None
    with recording() as recorder:
        execute(mine_in, mine_out)
    if recorder.failed or not recorder.launches:
        return None
    rows, records = recorder.table()
    fill(True)  # new values: a replay that kept anything of the first set differs
    execute(mine_in, mine_out)
    expected = [o.copy() for o in mine_out]
    for o, w in zip(mine_out, expected):  # what the replay must overwrite, everywhere
        if o.dtype.kind == "f":
            o.fill(np.nan)
        else:
            np.invert(w, out=o)
    replay(rows)
    exact = all(np.array_equal(o, w, equal_nan=True) for o, w in zip(mine_out, expected))
    return seconds if exact else None


def replays_exactly(
    execute: Callable[[list, list], Any],
    inputs: Sequence[np.ndarray | None],
    constant: Sequence[bool],
    outputs: Sequence[np.ndarray | None],
) -> float | None:
    """Whether ``execute(inputs, outputs)``'s launches may be recorded: the seconds a run of it
    took where its tensors are of a kind and size that are tried and a replay was proven to do
    what running does (see the module doc); None otherwise. It depends on the layer and its
    arrays' shapes, not on where they are: the verdict on one pool's arrays holds for
    another's."""
    if not outputs or any(o is None or not o.flags.c_contiguous for o in outputs):
        return None
    free = [x for x, fixed in zip(inputs, constant) if x is not None and not fixed]
    if any(x.dtype not in PROVEN_TYPES for x in free):
        return None
    if sum(x.nbytes for x in free) + sum(o.nbytes for o in outputs if o is not None) > MAX_TENSOR_BYTES:
        return None
    try:
        return _replays_exactly(execute, inputs, constant, outputs)
    except Exception as e:  # the layer stays a step of its own, which raises as it will
        logger.debug("launches not recorded: %s: %s", type(e).__name__, e)
        return None


def record(
    execute: Callable[[list, list], Any],
    inputs: Sequence[np.ndarray | None],
    constant: Sequence[bool],
    outputs: Sequence[np.ndarray | None],
    proven: Any = PROVE,
) -> LaunchCall | None:
    """``execute(inputs, outputs)``'s launches on these fixed arrays (a pool's), or None when
    replaying them is not proven to do what running does, or would keep too much (see the
    module doc). ``proven``: :func:`replays_exactly`'s verdict when it is known already (the
    seconds of the layer's work, or None), else it is proven here."""
    if proven is PROVE:
        proven = replays_exactly(execute, inputs, constant, outputs)
    if proven is None:
        return None
    try:
        with recording() as recorder:
            execute(list(inputs), list(outputs))
    except Exception as e:
        logger.debug("launches not recorded: %s: %s", type(e).__name__, e)
        return None
    if recorder.failed or not recorder.launches:
        return None
    mine = [x for x in (*inputs, *outputs) if x is not None]
    if _kept_bytes(recorder.keep, mine) > MAX_KEPT_BYTES:
        return None
    rows, records = recorder.table()
    return LaunchCall(tuple(o for o in outputs if o is not None), rows, records, recorder.keep, proven)


def prepare() -> None:
    """Compile :func:`replay` and :func:`replay_layers` (or load them from numba's cache) once
    per process, at load."""
    calls._register_parallel_tasks()
    table = types.int64[:, ::1]
    for function, signature in (
        (replay, (table,)),
        (replay_layers, (table, types.int64[::1], types.int64, types.int64[::1])),
    ):
        if signature not in function.overloads:
            function.compile(signature)
