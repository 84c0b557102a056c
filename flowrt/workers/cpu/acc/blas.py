"""Single-precision GEMM for CpuAcc kernels: scipy's BLAS called from inside numba, one thread
per call, on row-major views.

CpuAcc kernels split their window across workers themselves (``prange``), so each BLAS call
must run on the calling thread alone: :func:`pin_scipy_blas` limits scipy's OpenBLAS (the one
numba links to) to one thread. numpy's own OpenBLAS is left alone; CpuRef uses it.

:func:`sgemm` calls single-threaded BLAS (``openblas.py``: numpy's OpenBLAS, else scipy's). Unlike
``np.dot``, it takes strided views (a column block of a matrix, a transposed operand) and
``beta``, so a slice can write straight into its block of the output.

The kernels' parallel loops are kept small to compile: on a cold cache numba turns each
``prange`` loop into a gufunc of its own, wrapped twice, and every one of those libraries,
and the kernel's, re-optimizes and re-emits the whole tree of functions the loop body calls.
A kernel whose slice work is large therefore calls it by address instead
(:class:`SliceFunction`, :func:`run_tasks`, :func:`run_stages`): the slice function is compiled
once, on its own, and the parallel loop around it is a few calls (a MaxPool: 12.5 -> 8.6 s of
CPU on a cold cache). ``PRANGE_ONLY`` keeps numba from making parallel loops of anything but
``prange``, and :func:`read_only` gives weights one array type whatever their source.
"""

from __future__ import annotations

import logging

import numba
import numpy as np
import scipy.linalg.cython_blas  # noqa: F401  (loads the library numba's BLAS calls)
import threadpoolctl
from numba import njit, prange, types
from numba._dispatcher import compute_fingerprint
from numba.core import cgutils
from numba.core.cpu_options import ParallelOptions
from numba.extending import intrinsic

from flowrt.workers.cpu.acc.openblas import gemm, gemv, openblas_architecture

logger = logging.getLogger(__name__)

_pinned = False

# numba's ``parallel`` option for CpuAcc's kernels, ``@njit(parallel=PRANGE_ONLY)``: their
# parallel loops are their prange loops, one task per slice, and nothing else. With
# ``parallel=True`` numba also makes a parallel loop of every array allocation (np.zeros,
# np.full) and array expression in the kernel, each one more gufunc to compile and link on a
# cold cache (the Winograd loop nest: 23 -> 20 s), for work that a slice does in place, or
# that is tiny beside the kernel's.
PRANGE_ONLY = ParallelOptions(
    {"comprehension": False, "reduction": False, "inplace_binop": False, "setitem": False, "numpy": False,
     "stencil": False}
)  # fmt: skip


def read_only(a: np.ndarray) -> np.ndarray:
    """``a``, or a read-only view of it. Conv takes its weights and bias, Gemm and MatMul
    their operands, read-only whatever their source (constants are read-only; a bias of
    zeros, transformed weights or a tensor of the run are not): numba compiles a kernel once
    per distinct argument type, read-only being part of the type, and a conv kernel costs
    seconds to compile on a cold cache."""
    if not a.flags.writeable:
        return a
    view = a.view()
    view.flags.writeable = False
    return view


@intrinsic
def call_native(typingctx, address, args):
    """Call the jitted function at ``address`` (from :meth:`SliceFunction.address`) with the
    tuple ``args``, through numba's own calling convention; an exception it raises propagates.
    The caller's code holds a call through a pointer, not the callee's code."""

    def codegen(context, builder, signature, llargs):
        argtypes = list(args.types)
        function_type = context.call_conv.get_function_type(types.none, argtypes)
        callee = builder.inttoptr(llargs[0], function_type.as_pointer())
        values = [builder.extract_value(llargs[1], i) for i in range(len(argtypes))]
        status, _ = context.call_conv.call_function(builder, callee, types.none, argtypes, values)
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        return context.get_dummy_value()

    return types.none(address, args), codegen


class SliceFunction:
    """A jitted ``fn(task, step, *args)`` doing one task of a kernel's parallel loop, called by
    address from :func:`run_tasks` or :func:`run_stages` (``task``, ``step``: int64)."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self._addresses: dict[tuple[bytes, ...], int] = {}

    def address(self, args: tuple) -> int:
        """``fn`` compiled (or loaded from numba's cache) for ``args``, the very tuple the
        launcher is given: its types are those ``fn`` is called with, by construction."""
        key = tuple(map(compute_fingerprint, args))
        found = self._addresses.get(key)
        if found is None:
            signature = (types.int64, types.int64, *map(numba.typeof, args))
            self.fn.compile(signature)
            result = self.fn.overloads[signature]
            found = result.library.get_pointer_to_function(result.fndesc.llvm_func_name)
            self._addresses[key] = found
        return found


@njit(parallel=PRANGE_ONLY, nogil=True, cache=True)
def run_tasks(address, tasks, args):
    """Tasks ``0 .. tasks`` of a :class:`SliceFunction` at ``address`` (step 0), in parallel; a
    single task on the calling thread, with no parallel region."""
    if tasks == 1:
        call_native(address, (np.int64(0), np.int64(0)) + args)
        return
    for task in prange(tasks):
        call_native(address, (np.int64(task), np.int64(0)) + args)


@njit(parallel=PRANGE_ONLY, nogil=True, cache=True)
def run_stages(steps, first, first_tasks, first_args, second, second_tasks, second_args):
    """For each step (an image, a group of images): the ``first_tasks`` tasks of the slice
    function at address ``first`` in parallel (none when 0), then the ``second_tasks`` of
    ``second``. A stage of one task runs on the calling thread."""
    for step in range(steps):
        if first_tasks == 1:
            call_native(first, (np.int64(0), np.int64(step)) + first_args)
        elif first_tasks > 1:
            for task in prange(first_tasks):
                call_native(first, (np.int64(task), np.int64(step)) + first_args)
        if second_tasks == 1:
            call_native(second, (np.int64(0), np.int64(step)) + second_args)
        else:
            for task in prange(second_tasks):
                call_native(second, (np.int64(task), np.int64(step)) + second_args)


def pin_scipy_blas() -> None:
    """Limit scipy's OpenBLAS to one thread (once per process); numpy's keeps its threads."""
    global _pinned
    if _pinned:
        return
    for lib in threadpoolctl.ThreadpoolController().lib_controllers:
        # numpy's bundled library is libscipy_openblas64_ (in numpy.libs); scipy's is in scipy.libs.
        if "scipy" in lib.filepath and "libscipy_openblas64_" not in lib.filepath:
            lib.set_num_threads(1)
            logger.debug("pinned %s to one thread", lib.filepath)
    _pinned = True


_NO_TRANS, _TRANS = ord("N"), ord("T")

# OpenBLAS computes a GEMM whose m * n * k is at most SMALL_GEMM by kernels that skip packing
# the operands (its "small matrix" path, in its builds for AVX-512 machines): on the shapes of
# conv layers, 1.2-2x faster than its packed path (m=16, k=64: 115 against 55 GFLOP/s on one
# Zen 4 core). So :func:`sgemm` runs a GEMM of small m * k in blocks of columns that take
# that path, as long as a block keeps SMALL_GEMM_COLUMNS columns; with few columns per block
# the packed path would be slower (where a build lacks the small path, blocks of 16 or more
# columns cost the packed path little).
SMALL_GEMM = 1_000_000
SMALL_GEMM_COLUMNS = 16
# A GEMM of at most FEW_ROWS rows whose op(b) is b transposed (a fully connected layer at a
# small batch, its weights (n, k) row-major) takes the small path down to FEW_ROWS_COLUMNS
# columns per block: the packed path would first copy all the weights, tens of megabytes for
# the light models' first FC layers. m=4, k=18432, n=4096 (zfnet512's FC at batch 4): 17 ms
# in blocks of 13 columns, against 67 ms packed. A transposed b's block of columns is a block
# of its rows, contiguous; an untransposed one's is strided, and there narrow blocks run 2-3x
# slower than packed.
FEW_ROWS = 16
FEW_ROWS_COLUMNS = 4
# Whether the OpenBLAS called has that small path: its kernels for AVX-512 machines. Without
# it, blocks of columns only pay the packing again: (16, 2048) @ (2048, 2048) on one thread
# of a Haswell-kernel build took 4.2-4.5 ms in blocks of 30 columns.
SMALL_PATH = openblas_architecture() in ("SkylakeX", "Cooperlake", "SapphireRapids")


@njit(inline="always", nogil=True, cache=True)
def leading_dimension(x):
    """The row stride (in elements) of a row-major 2-D view whose rows are contiguous."""
    rows, cols = x.shape
    ld = x.strides[0] // 4 if rows > 1 else cols
    return max(ld, cols, 1)


@njit(nogil=True, cache=True)
def sgemm(trans_a, trans_b, alpha, a, b, beta, c):
    """``c = alpha * op(a) @ op(b) + beta * c`` on float32 2-D views with unit column stride;
    ``op(x)`` is ``x.T`` when its flag is set. Runs on the calling thread (see the module doc),
    in blocks of columns when ``m * k`` is small (see ``SMALL_GEMM``)."""
    m, n = c.shape
    k = a.shape[0] if trans_a else a.shape[1]
    if m == 0 or n == 0:
        return
    scalars = np.empty(2, np.float32)
    scalars[0] = alpha
    scalars[1] = beta
    if m == 1:
        # One output row (a fully connected layer at batch 1): GEMV reads op(b) once, where
        # GEMM would first copy all of it into packed panels. op(a)'s one row is contiguous
        # (a row of a, or a column of a one-column a); c's row is contiguous.
        # Row-major op(b) (k, n) is the column-major matrix (n, k) when not transposed.
        gemv(
            _TRANS if trans_b else _NO_TRANS,
            k if trans_b else n,
            n if trans_b else k,
            scalars,
            b,
            leading_dimension(b),
            a,
            c,
        )
        return
    step = n
    columns = FEW_ROWS_COLUMNS if m <= FEW_ROWS and trans_b else SMALL_GEMM_COLUMNS
    if SMALL_PATH and m * n * k > SMALL_GEMM and m * k * columns <= SMALL_GEMM:
        step = SMALL_GEMM // (m * k)
    ldb, ldc = leading_dimension(b), leading_dimension(c)
    for j0 in range(0, n, step):
        j1 = min(j0 + step, n)
        # Row-major C = op(A) op(B) is column-major C' = op(B)' op(A)': the operands swap
        # places. Columns j0:j1 of C come from those of op(B).
        gemm(
            _TRANS if trans_b else _NO_TRANS,
            _TRANS if trans_a else _NO_TRANS,
            j1 - j0,
            m,
            k,
            scalars,
            b[j0:j1] if trans_b else b[:, j0:j1],
            ldb,
            a,
            leading_dimension(a),
            c[:, j0:j1],
            ldc,
        )
