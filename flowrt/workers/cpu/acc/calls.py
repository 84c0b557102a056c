"""How CpuAcc kernels call their jitted work: by address, so that a caller's compiled code holds
a call, not a copy of the callee.

On a cold cache numba compiles a function together with every jitted function it calls: each
callee's code is linked into the caller's and optimized and emitted again there, and a
``prange`` loop is a gufunc of its own, wrapped twice, each of those libraries doing it once
more. A kernel's slice work therefore is a :class:`SliceFunction`, compiled once on its own,
which :func:`run_tasks` or :func:`run_stages` call by address: they are compiled per argument
tuple, but small and not parallel themselves (0.1-0.3 s, where a parallel loop of the same
calls cost 0.5-1.5 s); the one parallel loop, :func:`_parallel_tasks`, is compiled once for
all of them. A function that many kernels may call but few do (an activation other than Relu
and Clip, the row walk of an elementwise op in a tape) is a :class:`LateFunction`, reached
through a named slot and compiled when first needed. ``PRANGE_ONLY`` keeps numba from making
parallel loops of anything but ``prange``, and ``NATIVE`` from compiling Python and C wrappers
for functions that only compiled code calls.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import threading
from typing import Any

import numba
import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import njit, prange, types
from numba._dispatcher import compute_fingerprint
from numba.core import cgutils
from numba.core.cpu_options import ParallelOptions
from numba.core.datamodel import default_manager
from numba.core.datamodel.packer import ArgPacker
from numba.extending import intrinsic
from numba.np.ufunc.parallel import _launch_threads as launch_threads

from flowrt.workers.cpu import threading_layer
from flowrt.workers.cpu.acc import cache_stamp, contention, team
from flowrt.workers.cpu.worker_thread import AFTER_JOB
from flowrt.workers.cpu.workers import default_cpu_workers

logger = logging.getLogger(__name__)

cache_stamp.register()  # before this module jits anything

# numba's ``parallel`` option for CpuAcc's kernels, ``@njit(parallel=PRANGE_ONLY)``: their
# parallel loops are their prange loops, one task per slice, and nothing else. With
# ``parallel=True`` numba also makes a parallel loop of every array allocation (np.zeros,
# np.full) and array expression in the kernel, each one more gufunc to compile and link on a
# cold cache (the Winograd loop nest: 23 -> 20 s), for work that a slice does in place, or
# that is tiny beside the kernel's. Typed Any: numba takes a ParallelOptions for ``parallel``,
# where its stubs say bool.
PRANGE_ONLY: Any = ParallelOptions(
    {"comprehension": False, "reduction": False, "inplace_binop": False, "setitem": False, "numpy": False,
     "stencil": False}
)  # fmt: skip


def propagate(context, builder, status) -> None:
    """Where ``status`` (of a call through numba's calling convention) is an error, return it
    from the function being built, as numba's own ``raise`` does: the exception's info stored
    with the ``numba_exception_output`` mark, then the return, in one block. The mark is what
    LLVM's reference-count pruning (llvmlite's ``fanout_raise``) knows a raise by: with numba's
    ``return_status_propagate`` (an unmarked store and a return behind a test of the
    ``try`` state) it keeps the incref and decref around each call that takes arrays, two
    atomic updates and two calls each time; densenet121 made 94,000 a run. Not for a
    call inside ``try``: the exception leaves the function, as a raise there would not."""
    call_conv = context.call_conv
    with cgutils.if_unlikely(builder, status.is_error):
        store = builder.store(status.excinfoptr, call_conv._get_excinfo_argument(builder.function))
        store.set_metadata("numba_exception_output", builder.module.add_metadata([ir.IntType(1)(1)]))
        builder.ret(status.code)


@intrinsic
def call_native(typingctx, address, args):
    """Call the jitted function at ``address`` (from :meth:`SliceFunction.address`) with the
    tuple ``args``, through numba's own calling convention; an exception it raises propagates.
    The caller's code holds a call through a pointer, not the callee's code. The arrays are
    passed borrowed (:func:`_borrowed`): the caller holds them through the call, and the
    callee's increfs and decrefs of its arguments (numba counts a reference to each array
    argument as a function starts, and in a function with loops LLVM keeps them) find no
    meminfo to update. A Winograd conv's GEMM per tile element paid four of each a call."""

    def codegen(context, builder, signature, llargs):
        argtypes = list(args.types)
        function_type = context.call_conv.get_function_type(types.none, argtypes)
        callee = builder.inttoptr(llargs[0], function_type.as_pointer())
        values = [
            _borrowed(context, builder, t, builder.extract_value(llargs[1], i))
            for i, t in enumerate(argtypes)
        ]
        status, _ = context.call_conv.call_function(builder, callee, types.none, argtypes, values)
        propagate(context, builder, status)
        return context.get_dummy_value()

    return types.none(address, args), codegen


# The jit options of a function that only compiled code calls (by address, or linked into its
# callers): no Python or C wrapper to compile with it. Each wrapper converts every argument,
# 5-10% of the compile time of a small function on a cold cache. Typed dict[str, Any]: numba's
# stubs list neither wrapper option among njit's.
NATIVE: dict[str, Any] = {"nogil": True, "cache": True, "no_cpython_wrapper": True, "no_cfunc_wrapper": True}


class SliceFunction:
    """A jitted ``fn(task, step, *args)`` doing one task of a kernel's parallel loop, called by
    address from :func:`run_tasks` or :func:`run_stages` (``task``, ``step``: int64). Jitted
    with :data:`NATIVE`, it has no Python wrapper: :meth:`run` then runs even a single task
    through :func:`run_tasks`."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self._addresses: dict[bytes, int] = {}
        self._python = not fn.targetoptions.get("no_cpython_wrapper", False)

    def address(self, args: tuple) -> int:
        """``fn`` compiled (or loaded from numba's cache) for ``args``, the very tuple the
        launcher is given: its types are those ``fn`` is called with, by construction."""
        key = compute_fingerprint(args)  # the tuple's at once: a fifth of the time of each one's
        found = self._addresses.get(key)
        if found is None:
            found = native_address(self.fn, (types.int64, types.int64, *map(numba.typeof, args)))
            _register_parallel_tasks()  # before another thread finds the address and runs it
            self._addresses[key] = found
        return found

    def run(self, tasks: int, args: tuple) -> None:
        """Tasks ``0 .. tasks`` in parallel (:func:`run_tasks`); a single task called straight
        from Python where ``fn`` has a Python wrapper (no address to look up), unless launches
        are being recorded."""
        if tasks == 1 and self._python and RECORDING.recorder is None:
            self.fn(0, 0, *args)
        elif tasks > 0:
            address = self._addresses.get(compute_fingerprint(args))
            run_tasks(self.address(args) if address is None else address, tasks, args)


def native_address(fn, signature: tuple) -> int:
    """The address of jitted ``fn`` compiled (or loaded from numba's cache) for the argument
    types ``signature``, for :func:`call_native`."""
    fn.compile(signature)
    result = fn.overloads[signature]
    return result.library.get_pointer_to_function(result.fndesc.llvm_func_name)


@njit(parallel=PRANGE_ONLY, **NATIVE)
def _parallel_tasks(entry, tasks, step, data):
    """Tasks ``0 .. tasks`` of an entry (``_entry``) in parallel on CpuAcc's team
    (``team.py``), or on numba's layer where the team is busy; on the calling thread alone,
    with no parallel region, for a single task or a caller of one thread: the one parallel
    loop of all the launchers, compiled once whatever the slice functions' arguments."""
    if tasks == 1:
        call_native(entry, (np.int64(0), step, data))
        return
    threads = team.threads()
    if threads == 1:
        for task in range(tasks):
            call_native(entry, (np.int64(task), step, data))
        return
    failed = team.run(entry, tasks, step, data, threads)
    if failed == team.NOT_RUN:
        for task in prange(tasks):
            call_native(entry, (np.int64(task), step, data))
    elif failed < tasks:  # raised on a thread of the team: raised here again
        call_native(entry, (failed, step, data))


# The symbol :func:`_launch` calls :func:`_parallel_tasks` by: a name the JIT resolves when
# it links a launcher, compiled or loaded from the cache, not an address frozen into its code.
_PARALLEL_TASKS = "flowrt_parallel_tasks"
_ENTRY_ARGS = [types.int64] * 3


_registered = False
_register_lock = threading.Lock()


def _register_parallel_tasks() -> None:
    """Start numba's layer and CpuAcc's team, compile :func:`_parallel_tasks` and publish it as
    ``_PARALLEL_TASKS`` (once per process; a thread that comes meanwhile waits), before any
    launcher is linked: every slice address comes from :meth:`SliceFunction.address`, which
    calls this."""
    global _registered
    if _registered:
        return
    with _register_lock:
        if not _registered:
            threading_layer.prepare()
            launch_threads()  # the layer's symbols (get_num_threads), before anything links them
            cores = min(default_cpu_workers(), numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]  # numba.config sets its options at import
            if team.start(cores):
                contention.start(cores)
                AFTER_JOB.append(contention.observe)
            llvm.add_symbol(_PARALLEL_TASKS, native_address(_parallel_tasks, (types.int64,) * 4))
            _registered = True


def _entry(context, module, slice_args):
    """``entry(task, step, data)`` (numba's calling convention), defined once per module and
    argument types: calls the slice function whose address and argument tuple ``data``
    points at. It is what makes :func:`_parallel_tasks` one loop for every signature."""
    call_conv = context.call_conv
    value_types = [context.get_value_type(t) for t in slice_args]
    name = "flowrt.entry." + hashlib.sha1(repr(slice_args).encode()).hexdigest()
    if name in module.globals:
        return module.globals[name]
    entry = ir.Function(module, call_conv.get_function_type(types.none, _ENTRY_ARGS), name)
    entry.linkage = "internal"
    builder = ir.IRBuilder(entry.append_basic_block())
    task, step, data = call_conv.get_arguments(entry)
    pointer = builder.inttoptr(data, ir.LiteralStructType([ir.IntType(64), *value_types]).as_pointer())
    fields = [builder.load(cgutils.gep_inbounds(builder, pointer, 0, i)) for i in range(len(slice_args) + 1)]
    all_args = [types.int64, types.int64, *slice_args]
    callee = builder.inttoptr(fields[0], call_conv.get_function_type(types.none, all_args).as_pointer())
    status, _ = call_conv.call_function(builder, callee, types.none, all_args, [task, step, *fields[1:]])
    with cgutils.if_unlikely(builder, status.is_error):
        call_conv.return_status_propagate(builder, status)
    call_conv.return_value(builder, context.get_dummy_value())
    return entry


def _borrowed(context, builder, ty, value):
    """``value`` (of type ``ty``) with every array in it borrowed: no meminfo (nor parent),
    so that the threads of the parallel loop never touch their reference counts. Every view a
    slice takes counts a reference to its array, an atomic add on a line that the other
    threads take too: a GlobalAveragePool's two slices took longer than one. The caller holds
    the arrays for the loop's length, as numba's own gufuncs, whose arrays are borrowed."""
    if isinstance(ty, types.Array):
        array = context.make_array(ty)(context, builder, value)
        array.meminfo = cgutils.get_null_value(array.meminfo.type)
        array.parent = cgutils.get_null_value(array.parent.type)
        return array._getvalue()
    if isinstance(ty, types.BaseTuple):
        for i, item in enumerate(ty.types):
            borrowed = _borrowed(context, builder, item, builder.extract_value(value, i))
            value = builder.insert_value(value, borrowed, i)
    return value


@intrinsic
def borrowed(typingctx, array):
    """``array`` borrowed (:func:`_borrowed`; a tuple: every array in it), for a kernel to
    pass to a function inlined in a loop: numba counts a reference to each array an inlined
    function takes, and where that function has branches and loops LLVM keeps the incref and
    the decref, two calls and two atomic updates each time. A borrowed array has no meminfo
    to update. Only while the caller holds ``array`` itself, as a kernel holds its arguments
    and its scratch."""
    if not isinstance(array, (types.Array, types.BaseTuple)):
        return None

    def codegen(context, builder, signature, llargs):
        return _borrowed(context, builder, array, llargs[0])

    return array(array), codegen


@intrinsic
def _launch(typingctx, address, tasks, step, args, record):
    """Tasks ``0 .. tasks`` of the slice function at ``address`` (with ``step`` and the tuple
    ``args``), in parallel, through :func:`_parallel_tasks`; an exception propagates.

    With a non-empty ``record`` (int64) nothing runs: the launch is written there instead, as
    ``_parallel_tasks`` would be called with it (see ``launches.py``): the entry's address,
    the length in words of its data, then the data (the slice function's address and the
    arguments, arrays borrowed), or a 0 alone where the data do not fit."""

    def codegen(context, builder, signature, llargs):
        entry = _entry(context, builder.module, list(args.types))
        borrowed = _borrowed(context, builder, args, llargs[3])
        values = [llargs[0], *(builder.extract_value(borrowed, i) for i in range(len(args.types)))]
        struct = ir.LiteralStructType([v.type for v in values])
        data = cgutils.alloca_once(builder, struct)
        for i, value in enumerate(values):
            builder.store(value, cgutils.gep_inbounds(builder, data, 0, i))
        i64 = ir.IntType(64)
        kept = context.make_array(signature.args[4])(context, builder, llargs[4])
        with builder.if_else(builder.icmp_signed(">", kept.nitems, ir.Constant(i64, 0))) as (
            recording,
            running,
        ):
            with recording:
                words = (context.get_abi_sizeof(struct) + 7) // 8
                fits = builder.icmp_signed(">=", kept.nitems, ir.Constant(i64, 2 + words))
                with builder.if_else(fits) as (room, no_room):
                    with room:
                        builder.store(builder.ptrtoint(entry, i64), kept.data)
                        builder.store(ir.Constant(i64, words), builder.gep(kept.data, [ir.Constant(i64, 1)]))
                        target = builder.gep(kept.data, [ir.Constant(i64, 2)])
                        cgutils.raw_memcpy(
                            builder,
                            builder.bitcast(target, cgutils.voidptr_t),
                            builder.bitcast(data, cgutils.voidptr_t),
                            ir.Constant(i64, 8 * words),
                            1,
                        )
                    with no_room:
                        builder.store(ir.Constant(i64, 0), kept.data)
            with running:
                _call_parallel_tasks(
                    context,
                    builder,
                    [builder.ptrtoint(entry, i64), llargs[1], llargs[2], builder.ptrtoint(data, i64)],
                )
        return context.get_dummy_value()

    return types.none(address, tasks, step, args, record), codegen


def _call_parallel_tasks(context, builder, values) -> None:
    """A call of :func:`_parallel_tasks` with four int64 ``values``; an exception propagates."""
    call_conv = context.call_conv
    launcher_args = [types.int64] * 4
    launcher = cgutils.get_or_insert_function(
        builder.module, call_conv.get_function_type(types.none, launcher_args), _PARALLEL_TASKS
    )
    status, _ = call_conv.call_function(builder, launcher, types.none, launcher_args, values)
    propagate(context, builder, status)


@intrinsic
def launch_recorded(typingctx, entry, tasks, step, data):
    """A launch as ``_launch`` recorded it, run: ``_parallel_tasks(entry, tasks, step, data)``."""

    def codegen(context, builder, signature, llargs):
        _call_parallel_tasks(context, builder, list(llargs))
        return context.get_dummy_value()

    return types.none(types.int64, types.int64, types.int64, types.int64), codegen


# The launchers are compiled per argument tuple, and are not parallel themselves: a parallel
# loop costs 0.5-1.5 s to compile on a cold cache, these 0.1-0.3 s (their loop is
# _parallel_tasks, compiled once, which also runs a single task on the calling thread: one
# launch per stage to compile here, not a second call for that case). Python calls them:
# no C wrapper. ``record`` (int64, empty to run) records the launches instead (``_launch``).
@njit(nogil=True, cache=True, no_cfunc_wrapper=True)  # type: ignore[call-overload]  # numba's stubs lack no_cfunc_wrapper
def run_tasks_native(address, tasks, args, record):
    """Tasks ``0 .. tasks`` of a :class:`SliceFunction` at ``address`` (step 0), in parallel; a
    single task on the calling thread, with no parallel region."""
    if tasks > 0:
        _launch(address, np.int64(tasks), np.int64(0), args, record)


@njit(nogil=True, cache=True, no_cfunc_wrapper=True)  # type: ignore[call-overload]  # numba's stubs lack no_cfunc_wrapper
def run_stages_native(
    steps, first, first_tasks, first_args, second, second_tasks, second_args, record1, record2
):
    """For each step (an image, a group of images): the ``first_tasks`` tasks of the slice
    function at address ``first`` in parallel (none when 0), then the ``second_tasks`` of
    ``second``. A stage of one task runs on the calling thread. Non-empty ``record1`` and
    ``record2`` record the two launches instead (the same every step)."""
    for step in range(steps):
        if first_tasks > 0:
            _launch(first, np.int64(first_tasks), np.int64(step), first_args, record1)
        if second_tasks > 0:
            _launch(second, np.int64(second_tasks), np.int64(step), second_args, record2)


_NO_RECORD = np.zeros(0, np.int64)


def run_tasks(address: int, tasks: int, args: tuple) -> None:
    """Tasks ``0 .. tasks`` of a :class:`SliceFunction` at ``address`` (step 0), in parallel (a
    single task on the calling thread); recorded instead while a ``launches.recording`` is
    open on this thread."""
    recorder = RECORDING.recorder
    if recorder is None:
        run_tasks_native(address, tasks, args, _NO_RECORD)
    elif tasks > 0:
        record = recorder.buffer()
        run_tasks_native(address, tasks, args, record)
        recorder.add(record, tasks, 1, args)


def run_stages(steps, first, first_tasks, first_args, second, second_tasks, second_args) -> None:
    """For each of ``steps``: ``first_tasks`` tasks of the slice function at ``first``, then
    ``second_tasks`` of ``second`` (see :func:`run_stages_native`); recorded instead while a
    ``launches.recording`` is open on this thread."""
    recorder = RECORDING.recorder
    if recorder is None:
        run_stages_native(
            steps, first, first_tasks, first_args, second, second_tasks, second_args, _NO_RECORD, _NO_RECORD
        )
        return
    record1, record2 = recorder.buffer(), recorder.buffer()
    run_stages_native(
        steps, first, first_tasks, first_args, second, second_tasks, second_args, record1, record2
    )
    recorder.add_stages(steps, (record1, first_tasks, first_args), (record2, second_tasks, second_args))


class _Recording(threading.local):
    """The recorder open on this thread (``launches.recording``), if any."""

    recorder: Any = None


RECORDING = _Recording()


# ctypes for the LLVM argument types numba passes scalars and array fields as (any pointer:
# a void pointer)
_CTYPES = {"i8": ctypes.c_int8, "i32": ctypes.c_int32, "i64": ctypes.c_int64, "float": ctypes.c_float,
           "double": ctypes.c_double}  # fmt: skip


def _ctype(llvm_type: str):
    return ctypes.c_void_p if llvm_type.endswith("*") else _CTYPES[llvm_type]


# What each LateFunction's slot name takes: the LLVM types its arguments are passed as.
_LATE_ARGUMENTS: dict[str, tuple[str, ...]] = {}


def _llvm_arguments(argtypes) -> tuple[str, ...]:
    return tuple(str(t) for t in ArgPacker(default_manager, tuple(argtypes)).argument_types)


class LateFunction:
    """A jitted function that the kernels call through a named slot (:func:`call_late`): their
    code holds a load and an indirect call, not the function's code, and it is compiled (or
    loaded from numba's cache) at its first call, not when they are.

    The slot first holds a ctypes callback with the function's native signature, which
    compiles it, stores its address in the slot and calls it; later calls go straight to it.
    Made at import (the slot's name must be known to the JIT before any kernel using it is
    linked), it compiles nothing then; a kernel that knows it will call it calls
    :meth:`address` at load, where an error raises as any other. A first call from a thread
    of a parallel loop takes the GIL: callers are ``nogil``, as every kernel is."""

    def __init__(self, fn, argtypes: tuple, name: str) -> None:
        self.fn, self.argtypes, self.name = fn, tuple(argtypes), name
        arguments = _llvm_arguments(argtypes)
        _LATE_ARGUMENTS[name] = arguments
        # numba's calling convention: a status, then the return and exception pointers.
        self._prototype = ctypes.CFUNCTYPE(
            ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, *map(_ctype, arguments)
        )
        self._first = self._prototype(self._first_call)
        first_address = ctypes.cast(self._first, ctypes.c_void_p).value
        assert first_address is not None  # a callback's address, never null
        self._first_address = first_address
        self._slot = ctypes.c_int64(self._first_address)
        llvm.add_symbol(name, ctypes.addressof(self._slot))

    def address(self) -> int:
        """The compiled function's address (compiling it, once), now also in the slot."""
        if self._slot.value == self._first_address:
            self._slot.value = native_address(self.fn, self.argtypes)
        return self._slot.value

    def _first_call(self, *arguments):
        try:
            address = self.address()
        except BaseException:
            # A ctypes callback cannot raise into the kernel calling it, and returning would
            # pass for success: stop rather than leave outputs unwritten.
            logger.critical("could not compile %s", self.name, exc_info=True)
            os.abort()
        return self._prototype(address)(*arguments)


@intrinsic
def call_late(typingctx, name, args):
    """Call the :class:`LateFunction` registered as ``name`` (a string constant) with the
    tuple ``args``, which must be passed as its argument types are; an exception it raises
    propagates."""
    if not isinstance(name, types.StringLiteral):
        return None
    symbol = name.literal_value
    if _LATE_ARGUMENTS.get(symbol) != _llvm_arguments(args.types):
        raise numba.core.errors.TypingError(f"call_late: {symbol} does not take {args}")

    def codegen(context, builder, signature, llargs):
        call_conv = context.call_conv
        argtypes = list(args.types)
        slot = builder.module.globals.get(symbol) or ir.GlobalVariable(builder.module, ir.IntType(64), symbol)
        function_type = call_conv.get_function_type(types.none, argtypes)
        callee = builder.inttoptr(builder.load(slot), function_type.as_pointer())
        values = [  # borrowed, as call_native passes them
            _borrowed(context, builder, t, builder.extract_value(llargs[1], i))
            for i, t in enumerate(argtypes)
        ]
        status, _ = call_conv.call_function(builder, callee, types.none, argtypes, values)
        propagate(context, builder, status)
        return context.get_dummy_value()

    return types.none(name, args), codegen
