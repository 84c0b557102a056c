"""CpuAcc's GEMMs call numpy's OpenBLAS where it has the 64-bit interface, on one thread while
the CPU workers run jobs; numpy has its own thread count between runs."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest
import threadpoolctl
import trio
from numba import njit

from flowrt.workers.cpu import blas_threads
from flowrt.workers.cpu.acc import openblas
from flowrt.workers.cpu.acc.blas import sgemm
from flowrt.workers.cpu.workers import CpuWorkerPool


def _numpy_openblas() -> dict | None:
    for info in threadpoolctl.threadpool_info():
        if info.get("internal_api") == "openblas" and "openblas64_" in info.get("filepath", ""):
            return info
    return None


@njit(nogil=True)
def _fully_connected(x, w, y):
    sgemm(False, True, 1.0, x, w, 0.0, y)


def test_numpys_openblas_is_the_one_called_where_it_exists():
    assert openblas.NUMPY_OPENBLAS == (_numpy_openblas() is not None)


def test_a_small_batch_fully_connected_gemm_matches_numpy():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 512)).astype(np.float32)
    w = rng.standard_normal((300, 512)).astype(np.float32)
    y = np.full((16, 300), np.nan, np.float32)
    _fully_connected(x, w, y)
    np.testing.assert_allclose(y, x @ w.T, rtol=1e-4, atol=1e-3)


def _numpy_thread_count() -> int:
    info = _numpy_openblas()
    get = ctypes.CDLL(info["filepath"]).scipy_openblas_get_num_threads64_
    get.restype = ctypes.c_int
    return get()


@pytest.mark.skipif(_numpy_openblas() is None, reason="numpy has no 64-bit OpenBLAS here")
async def test_numpys_openblas_runs_one_thread_while_cpuacc_jobs_run_and_its_own_count_otherwise():
    before = _numpy_thread_count()
    x = np.ones((16, 64), np.float32)

    def cpuacc_job():
        blas_threads.hold_for_job()  # as CpuAcc's workloads do
        _fully_connected(x, np.ones((32, 64), np.float32), np.empty((16, 32), np.float32))
        return _numpy_thread_count()

    async with CpuWorkerPool(2) as pool:
        assert await pool.run_sync(cpuacc_job) == 1
        assert _numpy_thread_count() == before
        # a job that calls no CpuAcc kernel (CpuRef's) keeps numpy's threads
        assert await pool.run_sync(_numpy_thread_count) == before
        # Two jobs at once: the count stays one until the second one ends.
        started, gate, counts = threading.Event(), threading.Event(), []

        def slow_job():
            blas_threads.hold_for_job()
            started.set()
            gate.wait(5)
            return _numpy_thread_count()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: _append(counts, pool.run_sync(slow_job)))
            await trio.to_thread.run_sync(started.wait, 5)
            counts.append(await pool.run_sync(cpuacc_job))
            gate.set()
        assert counts == [1, 1]
        assert _numpy_thread_count() == before
    blas_threads.hold_for_job()  # outside a worker's job: nothing is held
    assert _numpy_thread_count() == before


async def _append(values, awaitable):
    values.append(await awaitable)
