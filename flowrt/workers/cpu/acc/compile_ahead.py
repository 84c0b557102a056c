"""A second process that compiles a network's CpuAcc kernels while its load compiles them.

On an empty numba cache a load is almost all compiling (resnet50: about 20 s), and numba
compiles on one core: one compile at a time per process, under the GIL. So when a load
first compiles, and its network has at least :data:`MIN_LAYERS` CpuAcc layers, it starts a
helper, ``python -m flowrt.workers.cpu.acc.compile_ahead``, and hands it the network (pickled,
through a pipe). The helper prepares the layers as the load does, but from the last one
back, at a lower priority, and each kernel it compiles goes into numba's disk cache; the load
goes on in order and finds there what the helper got to first. ``cache_claims`` keeps the
two from compiling one entry twice: the load waits for an entry the helper is compiling, the
helper skips a layer whose entry the load is compiling.

The load stops the helper when it ends (the helper finishes the compile it is in, then
exits; it also exits when its parent is gone). ``FLOWRT_COMPILE_AHEAD=0`` turns it off. No
helper on one core, where ``cache_claims`` is unavailable (Windows), for a network whose
constants pass :data:`MAX_CONSTANT_BYTES` (the helper holds a copy of them), or when the
network does not pickle (it is logged).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
from typing import Any

from flowrt.defaults import default_cpu_workers
from flowrt.workers.cpu.acc import cache_claims

logger = logging.getLogger(__name__)

ENV = "FLOWRT_COMPILE_AHEAD"
MIN_LAYERS = 16  # fewer CpuAcc layers than this: a helper's start would cost more than it saves
NICE = 5  # the helper's priority below the load's
MAX_CONSTANT_BYTES = 1 << 30  # larger networks compile alone: no second copy of their weights


def wanted(network: Any) -> bool:
    """Whether a load of ``network`` may start a helper (see the module doc)."""
    if os.environ.get(ENV, "1") == "0" or not cache_claims.AVAILABLE or default_cpu_workers() < 2:
        return False
    if sum(layer.backend == "CpuAcc" for layer in network.graph) < MIN_LAYERS:
        return False
    # the helper holds a copy of the weights while it runs
    return sum(_nbytes(layer) for layer in network.graph) <= MAX_CONSTANT_BYTES


def _nbytes(layer: Any) -> int:
    value = getattr(layer.descriptor, "value", None) if layer.kind == "Constant" else None
    return int(getattr(value, "nbytes", 0))


class CompileAhead:
    """Around the building of one load's workloads: starts the helper when the load first
    compiles (``cache_claims.on_compile``), stops it at the end."""

    def __init__(self, network: Any, workers: int, threads: int) -> None:
        self.network, self.workers, self.threads = network, workers, threads
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> CompileAhead:
        if wanted(self.network):
            cache_claims.on_compile(self._start)
        return self

    def __exit__(self, *exc_info: object) -> None:
        cache_claims.on_compile(None)
        self.stop()

    def _start(self) -> None:
        try:
            payload = pickle.dumps((self.network, self.workers, self.threads), protocol=5)
        except Exception as e:
            logger.info("CpuAcc compiles alone: the network does not pickle (%s: %s)", type(e).__name__, e)
            return
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", __name__],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except OSError as e:
            logger.info("CpuAcc compiles alone: no helper process (%s)", e)
            return
        self.process = process
        threading.Thread(target=_feed, args=(process, payload), daemon=True).start()
        # Reaped as soon as it exits: a helper killed mid-compile must not linger as a zombie,
        # which would keep its claims looking alive to the load that waits on them.
        threading.Thread(target=process.wait, daemon=True).start()
        logger.info("CpuAcc compiles ahead in process %d", process.pid)

    def stop(self) -> None:
        """Ask the helper to exit after the compile it is in (it is reaped in the background)."""
        process, self.process = self.process, None
        if process is not None and process.returncode is None:
            with contextlib.suppress(OSError):
                process.terminate()


def _feed(process: subprocess.Popen[bytes], payload: bytes) -> None:
    assert process.stdin is not None  # opened with a pipe
    with contextlib.suppress(OSError):
        process.stdin.write(payload)
        process.stdin.close()


def main() -> None:
    """The helper: prepare the network's CpuAcc layers from the last back, then exit."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with contextlib.suppress(OSError, AttributeError):
        os.nice(NICE)
    parent = os.getppid()
    network, workers, threads = pickle.load(sys.stdin.buffer)
    cache_claims.become_helper()

    from flowrt.engine.graph.graph import workload_info
    from flowrt.engine.memory.manager import MemoryManager
    from flowrt.engine.scheduler.job import JobContext
    from flowrt.workers.cpu.acc.workload_factory import AccWorkloadFactory

    factory = AccWorkloadFactory(MemoryManager(), workers)
    job = JobContext(threads)
    layers = [layer for layer in network.graph.topological_order() if layer.backend == "CpuAcc"]
    for layer in reversed(layers):
        if stop.is_set() or os.getppid() != parent:
            break
        try:
            options = network.options
            info = workload_info(layer, options.fast_math, options.reduce_fp32_to_fp16)
            factory.create_workload(info).prepare(job)
        except Exception as e:  # cache_claims.Claimed, or a layer that fails here as it will there
            logger.debug("helper skips layer %r: %s", layer.name, e)
        finally:
            cache_claims.release_all()  # a compile that failed holds its claim still


if __name__ == "__main__":
    main()
