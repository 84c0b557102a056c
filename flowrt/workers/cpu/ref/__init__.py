"""CpuRef: the numpy reference backend."""

from flowrt.workers.cpu.ref.backend import RefBackend

__all__ = ["RefBackend"]
