"""CpuAcc workloads: a prepared kernel per layer."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from flowrt.engine.scheduler.job import JobContext
from flowrt.errors import BackendError
from flowrt.registry import WorkloadInfo
from flowrt.types import static_dims
from flowrt.workers.cpu.acc import launches, preload, verdicts
from flowrt.workers.cpu.acc.kernels import kernel_for
from flowrt.workers.cpu.acc.tape import BoundCall, bind, warm_up
from flowrt.workers.cpu.blas_threads import hold_for_job

logger = logging.getLogger(__name__)


class AccWorkload:
    """One layer's numba kernel, prepared at load; ``execute`` runs all its slices and may
    write straight into the run's planned memory. A kernel that plans its split per call
    says so with ``takes_job``; the workload then takes the job's context too (``execute(
    inputs, outputs, job)``, see ``flowrt.engine.scheduler.job``) and hands it on; other
    kernels are called as ``execute(inputs, outputs)``."""

    writes_in_place = True

    def __init__(self, kernel: Any, info: WorkloadInfo) -> None:
        self.kernel = kernel
        self.info = info
        self.takes_job = bool(getattr(kernel, "takes_job", False))
        self._proven: dict[str, float | None] = {}  # launches.replays_exactly's verdicts, per split
        self._proving = threading.Lock()

    def prepare(self, job: JobContext | None = None) -> None:
        """Run the kernel once on ones (constants as they are), so that its numba functions
        are compiled, or loaded from numba's cache, at load rather than in the first run (in
        ``job``, the context of the load's own job, for a kernel that takes one: it plans as
        a run would). Layers whose shapes are not all static are left to warm up on their
        first run, and so is a kernel that refuses ones (its values matter): that is logged,
        not raised, since the real inputs decide whether the layer fails. In a load whose
        kernels came from its network's manifest (``preload``) it does not run: a kernel that
        derives forms of its constant weights on its first run makes them (``make_forms``)."""
        warm_up(self.kernel)
        if getattr(self.kernel, "records_launches", True):
            launches.prepare()
        infos = self.info.inputs
        if not all(i is None or i.is_static for i in infos):
            return
        if preload.warm():  # its kernels are loaded: only what a run derives from its weights
            make_forms = getattr(self.kernel, "make_forms", None)
            if make_forms is not None:
                shapes = [None if i is None else static_dims(i.shape) for i in infos]
                make_forms(shapes, job if self.takes_job else None)
            return
        constants = self.info.constants or (None,) * len(infos)
        inputs = [
            c if c is not None else None if i is None else np.ones(static_dims(i.shape), i.dtype.numpy)
            for i, c in zip(infos, constants)
        ]
        try:
            self.execute(inputs, None, job if self.takes_job else None)
        except Exception as e:
            logger.info(
                "CpuAcc layer %r not warmed up at load: %s: %s", self.info.layer_name, type(e).__name__, e
            )

    def execute(
        self,
        inputs: Sequence[np.ndarray | None],
        outputs: Sequence[np.ndarray] | None = None,
        job: JobContext | None = None,
    ) -> list[np.ndarray]:
        hold_for_job()  # numpy's OpenBLAS on one thread: the kernels split their windows
        if job is None:
            return self.kernel.execute(inputs, outputs)
        return self.kernel.execute(inputs, outputs, job)

    def bind(
        self, inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray | None]
    ) -> BoundCall | launches.LaunchCall | None:
        """This layer's work on arrays that every run of a memory pool uses (its outputs'
        planned views, None where unplanned) as an instruction of CpuAcc's tape, when it is
        small elementwise work (see ``flowrt.workers.cpu.acc.tape``); else its launches
        recorded for replay, where that is proven exact (``flowrt.workers.cpu.acc.launches``;
        a kernel class may opt out with ``records_launches = False``); None otherwise."""
        call = bind(self.kernel, inputs, outputs)
        if call is not None or not getattr(self.kernel, "records_launches", True):
            return call
        constants = self.info.constants or ()
        constant = [i < len(constants) and constants[i] is not None for i in range(len(inputs))]
        every = self._record("every", self.kernel.execute, inputs, constant, outputs)
        if every is None or not self.takes_job or getattr(self.kernel, "workers", 1) == 1:
            return every
        # A run sharing the cores has one thread: the kernel plans its split for that then.
        # Where that split cannot be recorded the layer is not: the lone run's split replayed
        # on one thread can cost twice the layer's work (a conv split by pixels reads all its
        # weights once per slice).
        alone = JobContext(1)
        one = self._record("one", lambda i, o: self.kernel.execute(i, o, alone), inputs, constant, outputs)
        return None if one is None else attrs.evolve(every, one_thread=one)

    def _record(self, split: str, execute: Any, inputs: Any, constant: Any, outputs: Any) -> Any:
        """``launches.record``, its proof made on the first pool's arrays and kept for the
        others' (a pool recording at the same time waits for it: it runs the layer a few times),
        and for later processes (``verdicts``)."""
        with self._proving:
            if split not in self._proven:
                workers = 1 if split == "one" else getattr(self.kernel, "workers", 1)
                self._proven[split] = verdicts.proven(
                    verdicts.key(self.info, split, workers),
                    lambda: launches.replays_exactly(execute, inputs, constant, outputs),
                )
        return launches.record(execute, inputs, constant, outputs, proven=self._proven[split])


class AccWorkloadFactory:
    """Makes CpuAcc workloads whose windows split across ``workers`` CPU workers."""

    def __init__(self, memory_manager: Any, workers: int) -> None:
        self.memory_manager = memory_manager
        self.workers = workers

    def create_workload(self, info: WorkloadInfo) -> AccWorkload:
        kernel = kernel_for(info.kind)
        if kernel is None:
            raise BackendError(f"CpuAcc has no kernel for layer {info.layer_name!r} ({info.kind})")
        if info.activation is not None:
            from flowrt.workers.cpu.acc.backend import FUSED_ACTIVATION_KINDS  # the backend imports us

            if info.kind not in FUSED_ACTIVATION_KINDS:  # refused, never run without it
                raise BackendError(
                    f"CpuAcc applies fused activations to {', '.join(sorted(FUSED_ACTIVATION_KINDS))} only; "
                    f"layer {info.layer_name!r} ({info.kind}) carries a fused {info.activation.kind}"
                )
        return AccWorkload(kernel(info, self.workers), info)
