"""CpuAcc: numba kernels with execution windows split across CPU workers."""

from flowrt.workers.cpu.acc.backend import AccBackend

__all__ = ["AccBackend"]
