"""CpuAcc's GEMMs call numpy's OpenBLAS where it has the 64-bit interface, one thread per
call, and leave the calling thread's OpenBLAS thread count as it was."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import threadpoolctl
from numba import njit

from flowrt.workers.cpu.acc import openblas
from flowrt.workers.cpu.acc.blas import sgemm


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


@pytest.mark.skipif(_numpy_openblas() is None, reason="numpy has no 64-bit OpenBLAS here")
def test_the_calling_thread_keeps_numpys_thread_count():
    info = _numpy_openblas()
    set_local = ctypes.CDLL(info["filepath"]).openblas_set_num_threads_local
    set_local.restype, set_local.argtypes = ctypes.c_int, [ctypes.c_int]
    x = np.ones((16, 64), np.float32)
    _fully_connected(x, np.ones((32, 64), np.float32), np.empty((16, 32), np.float32))
    # Setting 0 (the process's count) returns the count the thread had: not the GEMM's 1.
    assert set_local(0) == info["num_threads"]
