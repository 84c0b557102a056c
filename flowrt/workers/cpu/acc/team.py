"""CpuAcc's own team of helper threads for its parallel regions: they spin between regions, so
a layer's slices start together.

numba's threading layer (TBB here, see ``threading_layer.py``) lets its helper threads sleep as
soon as a region ends, and the next region wakes them: on a 2-core AVX2 EPYC VM a helper
started 13-16 us after the caller, so two slices of 10 us took 25 us (one thread: 22) and two
of 32 us took 48 (64); on this team, 13 and 34. ONNX Runtime's and OpenMP's pools spin
between regions too. Whole models gain less (1-5% on 2 cores), since most of their small
layers run as one task.

- ``cores - 1`` helper threads, started with the process's first launch (:func:`start`), each
  in a jitted loop without the GIL (:func:`_helper`). A helper waits for a new region by
  spinning on the control block's epoch for ``SPIN_NS``, yielding the core every few pauses to
  any thread that wants it (a busy machine's other processes, the caller itself), then sleeps
  on a futex (a timed wait: a lost wake-up costs time, never a hang); the caller wakes sleepers,
  and one woken on the caller's CPU moves off it (:func:`_keep_off`).
  While another process keeps the cores busy (``CONTENDED``, set by ``contention.py`` from the
  regions no helper joined, ``MISSED``), it spins only briefly and never yields.
- One region at a time: a caller claims the team (:func:`run`), else it answers ``NOT_RUN``
  and the caller runs its region on numba's layer as before (two runs in flight at once, a
  region started inside a task). Who takes a task takes the next index (an atomic counter),
  the caller from the front, the helpers from the back: a helper the OS does not schedule
  takes none, and the caller does every task where no helper comes. The caller waits for
  the tasks, not for the helpers. With one helper and two tasks, each thread does the same
  task region after region: an LSTM's steps each read their half of R (512 KiB at hidden
  256) from their own core's L2; with either thread taking either half as it came, a layer
  took 600-650 us, now 560.
- The region's fields are published behind the epoch as a sequence lock (odd: being
  written) once every helper has left the previous region: a helper counts itself in, then
  checks the epoch again, and the caller sets the epoch odd, then waits for that count to be
  zero (each side's store before its load, sequentially consistent).
- A task that raises is not raised inside the region (the region's arguments live in the
  caller's frame while a helper may still read them): it is counted as done, the first one
  failed is kept, and :func:`run` returns its index for the caller to run again, which raises
  on the caller's thread.
- Linux on x86-64 and AArch64 (futex and its syscall numbers); elsewhere, and in a process
  forked from one whose team had started, regions run on numba's layer.

Like numba's threading layer it is process-wide: the helpers live as long as the process,
sleeping when no region comes.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from flowrt.workers.cpu.acc import cache_stamp

cache_stamp.register()  # before this module jits anything: its functions cached as the package's

# The control block: int64 words, each counter on a cache line of its own.
OWNER, EPOCH, ACTIVE, NEXT, DONE, SLEEPERS, FAILED, DISABLED, JOINED = (8 * i for i in range(9))
ENTRY, TASKS, STEP, DATA, HELPERS, REGIONS = (72 + i for i in range(6))
# Regions with helpers asked for that the caller ran with none joining in time, and whether
# another process keeps the cores busy (non-zero), both for ``contention.py``.
MISSED, CONTENDED = 78, 79
# The CPU of the caller that last woke sleeping helpers (see _keep_off)
CALLER_CPU = 80
WORDS = 81

# What :func:`run` answers when the team is busy, or not there: run the region elsewhere.
NOT_RUN = -1

# How long an idle helper spins before it sleeps: the gaps between a run's layers, and
# between the runs of a busy stream, are shorter; idle helpers soon leave the cores.
SPIN_NS = 300_000
# A sleeping helper's wait before it looks again by itself; a caller's spin, in pauses,
# before it yields the core while it waits for a helper that the OS has not scheduled.
SLEEP_NS = 50_000_000
CALLER_SPINS = 4096
# A helper's spin while another process keeps the cores busy (``CONTENDED``), without
# yielding: it soon sleeps, and the caller's wake at the next region puts it back on a core.
CONTENDED_SPIN_NS = 5_000

# (futex, sched_yield, getcpu, sched_setaffinity) syscall numbers
_SYSCALLS = {"x86_64": (202, 24, 309, 203), "aarch64": (98, 124, 168, 122)}
_FUTEX_WAIT_PRIVATE, _FUTEX_WAKE_PRIVATE = 128, 129
_SYMBOL, _SYSCALL_SYMBOL, _CLOCK_SYMBOL = "flowrt_team", "flowrt_team_syscall", "flowrt_team_clock"

_block = np.zeros(WORDS + 8, np.int64)
_offset = (-_block.ctypes.data % 64) // 8
CONTROL = _block[_offset : _offset + WORDS]  # 64-byte aligned

SUPPORTED = sys.platform == "linux" and platform.machine() in _SYSCALLS
_FUTEX, _SCHED_YIELD, _GETCPU, _SET_AFFINITY = _SYSCALLS.get(platform.machine(), (0, 0, 0, 0))


def _publish() -> None:
    """The control block and libc's ``syscall`` and ``clock_gettime`` under the names the
    team's code links to (at import, before any of it is linked)."""
    llvm.add_symbol(_SYMBOL, CONTROL.ctypes.data)
    if SUPPORTED:
        libc = ctypes.CDLL(None)
        for symbol, name in ((_SYSCALL_SYMBOL, "syscall"), (_CLOCK_SYMBOL, "clock_gettime")):
            address = ctypes.cast(getattr(libc, name), ctypes.c_void_p).value
            assert address is not None
            llvm.add_symbol(symbol, address)


CONTROL[DISABLED] = 1  # until the helpers are started
CONTROL[CALLER_CPU] = -1
_publish()

_i64 = ir.IntType(64)


def _word(builder, index):
    """A pointer to the control block's word ``index`` (an i64 value)."""
    module = builder.module
    block = module.globals.get(_SYMBOL) or ir.GlobalVariable(module, ir.ArrayType(_i64, WORDS), _SYMBOL)
    return builder.gep(block, [ir.Constant(_i64, 0), index])


@intrinsic
def _load(typingctx, index):
    """Word ``index``, loaded sequentially consistent."""

    def codegen(context, builder, signature, llargs):
        return builder.load_atomic(_word(builder, llargs[0]), "seq_cst", 8)

    return types.int64(types.int64), codegen


@intrinsic
def _store(typingctx, index, value):
    """``value`` stored into word ``index``, sequentially consistent."""

    def codegen(context, builder, signature, llargs):
        builder.store_atomic(llargs[1], _word(builder, llargs[0]), "seq_cst", 8)
        return context.get_dummy_value()

    return types.none(types.int64, types.int64), codegen


@intrinsic
def _add(typingctx, index, value):
    """Word ``index`` before ``value`` was added to it, atomically."""

    def codegen(context, builder, signature, llargs):
        return builder.atomic_rmw("add", _word(builder, llargs[0]), llargs[1], "seq_cst")

    return types.int64(types.int64, types.int64), codegen


@intrinsic
def _swap(typingctx, index, expected, value):
    """Whether word ``index`` held ``expected`` and now holds ``value`` (compare and swap)."""

    def codegen(context, builder, signature, llargs):
        pair = builder.cmpxchg(_word(builder, llargs[0]), llargs[1], llargs[2], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)

    return types.boolean(types.int64, types.int64, types.int64), codegen


@intrinsic
def _pause(typingctx):
    """The CPU's spin-wait hint."""

    def codegen(context, builder, signature, llargs):
        if platform.machine() == "x86_64":
            hint = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause"
            )
            builder.call(hint, [])
        elif platform.machine() == "aarch64":
            fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(32)])
            hint = cgutils.get_or_insert_function(builder.module, fnty, "llvm.aarch64.hint")
            builder.call(hint, [ir.Constant(ir.IntType(32), 1)])  # YIELD
        return context.get_dummy_value()

    return types.none(), codegen


def _syscall(builder, *args):
    fnty = ir.FunctionType(_i64, [_i64], var_arg=True)
    function = cgutils.get_or_insert_function(builder.module, fnty, _SYSCALL_SYMBOL)
    return builder.call(function, list(args))


@intrinsic
def _now_ns(typingctx):
    """CLOCK_MONOTONIC in nanoseconds."""

    def codegen(context, builder, signature, llargs):
        fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32), _i64.as_pointer()])
        clock = cgutils.get_or_insert_function(builder.module, fnty, _CLOCK_SYMBOL)
        spec = cgutils.alloca_once(builder, ir.ArrayType(_i64, 2))
        first = builder.gep(spec, [ir.Constant(_i64, 0), ir.Constant(_i64, 0)])
        builder.call(clock, [ir.Constant(ir.IntType(32), 1), first])
        seconds = builder.load(first)
        nanoseconds = builder.load(builder.gep(spec, [ir.Constant(_i64, 0), ir.Constant(_i64, 1)]))
        return builder.add(builder.mul(seconds, ir.Constant(_i64, 1_000_000_000)), nanoseconds)

    return types.int64(), codegen


@intrinsic
def _sleep(typingctx, index, value, timeout_ns):
    """Sleep on word ``index`` while its low 32 bits equal ``value``'s, at most
    ``timeout_ns`` (a futex wait)."""

    def codegen(context, builder, signature, llargs):
        spec = cgutils.alloca_once(builder, ir.ArrayType(_i64, 2))
        billion = ir.Constant(_i64, 1_000_000_000)
        builder.store(
            builder.sdiv(llargs[2], billion), builder.gep(spec, [ir.Constant(_i64, 0), ir.Constant(_i64, 0)])
        )
        builder.store(
            builder.srem(llargs[2], billion), builder.gep(spec, [ir.Constant(_i64, 0), ir.Constant(_i64, 1)])
        )
        address = builder.ptrtoint(_word(builder, llargs[0]), _i64)
        expected = builder.and_(llargs[1], ir.Constant(_i64, 0xFFFFFFFF))
        wait = ir.Constant(_i64, _FUTEX_WAIT_PRIVATE)
        _syscall(builder, ir.Constant(_i64, _FUTEX), address, wait, expected, builder.ptrtoint(spec, _i64))
        return context.get_dummy_value()

    return types.none(types.int64, types.int64, types.int64), codegen


@intrinsic
def _wake(typingctx, index, count):
    """Wake up to ``count`` threads sleeping on word ``index``."""

    def codegen(context, builder, signature, llargs):
        address = builder.ptrtoint(_word(builder, llargs[0]), _i64)
        _syscall(
            builder, ir.Constant(_i64, _FUTEX), address, ir.Constant(_i64, _FUTEX_WAKE_PRIVATE), llargs[1]
        )
        return context.get_dummy_value()

    return types.none(types.int64, types.int64), codegen


@intrinsic
def _yield(typingctx):
    """Give the core to another thread (sched_yield)."""

    def codegen(context, builder, signature, llargs):
        _syscall(builder, ir.Constant(_i64, _SCHED_YIELD))
        return context.get_dummy_value()

    return types.none(), codegen


@intrinsic
def _cpu(typingctx):
    """The CPU the calling thread runs on (getcpu), -1 where that fails."""

    def codegen(context, builder, signature, llargs):
        slot = cgutils.alloca_once(builder, ir.IntType(32))
        builder.store(ir.Constant(ir.IntType(32), -1), slot)
        zero = ir.Constant(_i64, 0)
        _syscall(builder, ir.Constant(_i64, _GETCPU), builder.ptrtoint(slot, _i64), zero, zero)
        return builder.sext(builder.load(slot), _i64)

    return types.int64(), codegen


@intrinsic
def _set_affinity(typingctx, address, size):
    """Restrict the calling thread to the CPUs of the bit mask of ``size`` bytes at
    ``address`` (sched_setaffinity)."""

    def codegen(context, builder, signature, llargs):
        _syscall(builder, ir.Constant(_i64, _SET_AFFINITY), ir.Constant(_i64, 0), llargs[1], llargs[0])
        return context.get_dummy_value()

    return types.none(types.int64, types.int64), codegen


@njit(nogil=True, cache=True)
def _keep_off(allowed):
    """A helper just woken, on the CPU of the caller that woke it, moves to the process's
    other CPUs (``allowed``: their bit mask) and stays off that one. Linux puts a woken
    thread on its waker's CPU when the others look busy, as an idle vCPU that the host
    descheduled does: the helper waited behind the caller and missed regions for
    milliseconds (squeezenet with 10 ms between runs: 40% of them, run by one thread)."""
    cpu = _cpu()
    if 0 <= cpu < 64 * allowed.shape[0] and cpu == _load(CALLER_CPU):
        mask = allowed.copy()
        mask[cpu // 64] &= ~(np.int64(1) << (cpu % 64))
        _set_affinity(mask.ctypes.data, 8 * mask.shape[0])  # none left: refused, no change


@intrinsic
def threads(typingctx):
    """numba's thread count on the calling thread (``numba.get_num_threads``), called by the
    name numba's layer publishes: ``get_num_threads`` itself calls it through a ctypes
    pointer, which numba will not cache."""

    def codegen(context, builder, signature, llargs):
        fnty = ir.FunctionType(_i64, [])
        return builder.call(cgutils.get_or_insert_function(builder.module, fnty, "get_num_threads"), [])

    return types.int64(), codegen


@intrinsic
def _task(typingctx, entry, task, step, data):
    """Whether task ``task`` of the entry at ``entry`` (``calls._entry``) ran without raising:
    its exception is not propagated here (see the module doc)."""

    def codegen(context, builder, signature, llargs):
        argtypes = [types.int64] * 3
        function_type = context.call_conv.get_function_type(types.none, argtypes)
        callee = builder.inttoptr(llargs[0], function_type.as_pointer())
        status, _ = context.call_conv.call_function(builder, callee, types.none, argtypes, list(llargs[1:]))
        return builder.not_(status.is_error)

    return types.boolean(types.int64, types.int64, types.int64, types.int64), codegen


# A claim from the back of a region's tasks adds this to ``NEXT``, one from the front 1: the
# word counts both, so that a claim sees how many tasks were taken before it from either end.
_BACK = 1 << 32


@njit(nogil=True, cache=True)
def _take_tasks(entry, tasks, step, data, back):
    """Tasks of the region taken one index at a time until none is left, from the front (the
    caller) or from the back (the helpers, ``back``); each counted done, the first one failed
    kept in ``FAILED``. The caller's first task is always task 0 and, with one helper, the
    helper's first the last: a thread reads the same part of a layer's data region after
    region, from its own core's caches."""
    while True:
        taken = _add(NEXT, _BACK if back else 1)
        front, behind = taken & (_BACK - 1), taken >> 32
        if front + behind >= tasks:
            return
        task = tasks - 1 - behind if back else front
        if not _task(entry, task, step, data):
            _swap(FAILED, tasks, task)
        _add(DONE, 1)


@njit(nogil=True, cache=True)
def _wait_for(index, value):
    """Until word ``index`` holds ``value``: spinning, then yielding the core between looks."""
    spins = 0
    while _load(index) != value:
        spins += 1
        if spins < CALLER_SPINS:
            _pause()
        else:
            _yield()


@njit(nogil=True, cache=True)
def run(entry, tasks, step, data, threads):
    """Tasks ``0 .. tasks`` of ``entry`` on the caller and up to ``threads - 1`` helpers: the
    index of the first task that raised (for the caller to run again), ``tasks`` when none
    did, or ``NOT_RUN`` where the team is busy or not there."""
    if _load(DISABLED) != 0 or not _swap(OWNER, 0, 1):
        return NOT_RUN
    epoch = _load(EPOCH)
    _store(EPOCH, epoch + 1)  # odd: helpers stay out while the fields are written
    _wait_for(ACTIVE, 0)
    _store(ENTRY, entry)
    _store(TASKS, tasks)
    _store(STEP, step)
    _store(DATA, data)
    helpers = min(threads, tasks) - 1
    _store(HELPERS, helpers)
    _store(JOINED, 0)
    _store(NEXT, 0)
    _store(DONE, 0)
    _store(FAILED, tasks)
    _store(EPOCH, epoch + 2)
    if _load(SLEEPERS) > 0:
        _store(CALLER_CPU, _cpu())
        _wake(EPOCH, helpers)
    _take_tasks(entry, tasks, step, data, False)
    _wait_for(DONE, tasks)
    if helpers > 0 and _load(JOINED) == 0:
        _store(MISSED, _load(MISSED) + 1)
    failed = _load(FAILED)
    _store(REGIONS, _load(REGIONS) + 1)
    _store(OWNER, 0)
    return failed


@njit(nogil=True, cache=True)
def _wait_past(epoch, spin_ns, sleep_ns, allowed):
    """Until the epoch is no longer ``epoch``: spinning for ``spin_ns`` (yielding the core
    now and then to a thread that wants it), then asleep, waking each ``sleep_ns`` to look.
    While another process keeps the cores busy (``CONTENDED``), only CONTENDED_SPIN_NS and
    never yielding: on Linux's EEVDF scheduler a yield beside a busy thread often hands it
    the core for a whole slice (milliseconds), and the helper missed nearly every region;
    woken from its sleep, it is back on a core as the region starts."""
    start = _now_ns()
    contended = _load(CONTENDED) != 0
    if contended:
        spin_ns = CONTENDED_SPIN_NS
    looks = 0
    while _load(EPOCH) == epoch:
        _pause()
        looks += 1
        if looks % 16 == 0 and not contended:
            _yield()
        if looks % 64 == 0 and _now_ns() - start > spin_ns:
            _add(SLEEPERS, 1)
            while _load(EPOCH) == epoch:
                _sleep(EPOCH, epoch, sleep_ns)
            _add(SLEEPERS, -1)
            _keep_off(allowed)


@njit(nogil=True, cache=True)
def _helper(spin_ns, sleep_ns, allowed):
    """A helper's loop: wait for a new region, join it if the caller's thread count leaves
    room for one more thread, take tasks until none is left; for the process's life."""
    seen = _load(EPOCH)
    while True:
        epoch = _load(EPOCH)
        if epoch == seen or epoch % 2 == 1:
            _wait_past(epoch, spin_ns, sleep_ns, allowed)
            continue
        _add(ACTIVE, 1)
        if _load(EPOCH) == epoch:  # else the caller is writing the next region's fields
            seen = epoch
            if _add(JOINED, 1) < _load(HELPERS):
                _take_tasks(_load(ENTRY), _load(TASKS), _load(STEP), _load(DATA), True)
        _add(ACTIVE, -1)


_start_lock = threading.Lock()
_threads: list[threading.Thread] = []
_started_in = 0  # the pid whose helpers these are


def regions() -> int:
    """How many parallel regions the team has run in this process."""
    return int(CONTROL[REGIONS])


def helpers() -> int:
    """How many helper threads the team has (0 before :func:`start`)."""
    return len(_threads) if _started_in == os.getpid() else 0


def _off(cores: int) -> str | None:
    """Why a process that may use ``cores`` has no team, or None where it has one."""
    if not SUPPORTED:
        return "not on this platform (Linux on x86-64 or AArch64)"
    if os.environ.get("FLOWRT_CPU_SPIN") == "0":
        return "FLOWRT_CPU_SPIN=0"
    if cores < 2:
        return "one core"
    return None


def describe(cores: int) -> str:
    """What the team is, or would be once started, in a process that may use ``cores``."""
    off = _off(cores)
    if off is not None:
        return f"off: {off}"
    count = helpers() or cores - 1
    shared = ", now sleeping at once: another process keeps the cores busy" if CONTROL[CONTENDED] else ""
    return f"{count} helper thread{'s' * (count > 1)}, spinning {SPIN_NS // 1000} us between regions{shared}"


def start(cores: int) -> bool:
    """Start ``cores - 1`` helpers (once per process; a later call starts none): whether the
    team runs regions."""
    global _started_in
    if _off(cores) is not None:
        return False
    with _start_lock:
        if _started_in == 0:
            _helper.compile((types.int64, types.int64, types.Array(types.int64, 1, "C")))
            CONTROL[DISABLED] = 0
            allowed = np.zeros(16, np.int64)  # the process's CPUs, a bit mask as glibc's cpu_set_t
            for cpu in os.sched_getaffinity(0) & set(range(64 * 16)):
                allowed[cpu // 64] |= np.int64(1) << np.int64(cpu % 64)
            args = (SPIN_NS, SLEEP_NS, allowed)
            for index in range(cores - 1):
                thread = threading.Thread(target=_helper, args=args, name=f"flowrt-team-{index}", daemon=True)
                thread.start()
                _threads.append(thread)
            _started_in = os.getpid()
            os.register_at_fork(after_in_child=_forked)
    return _started_in == os.getpid()


def _forked() -> None:
    """In a forked child the helpers are not there: its regions run on numba's layer."""
    CONTROL[DISABLED] = 1
