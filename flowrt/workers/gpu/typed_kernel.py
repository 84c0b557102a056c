"""A kernel whose scalar argument types are declared once, so each launch is cheap.

pyopencl converts an undeclared numpy scalar argument on every call through a generic path
that costs about 10 µs per scalar: a GEMM launch with twenty scalars spent over 300 µs in
``set_args`` on an H100, twenty-five times the enqueue itself. Declared with
``set_scalar_arg_dtypes``, the same arguments are packed in about 3 µs in all. GpuAcc's
kernels always pass the same argument types at each position (numpy scalars from ``ints``
and ``np.float32``, buffers elsewhere), so the types are read off the first call's arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from flowrt.workers.gpu.launches import LAUNCHED, current_recording


class TypedKernel:
    """Wraps a ``cl.Kernel``, made by ``make`` when first used (its program may still be
    building): calls declare the scalar argument types at the first launch; every other
    attribute is the kernel's own."""

    __slots__ = ("_kernel", "_make", "_typed")

    def __init__(self, make: Callable[[], Any]) -> None:
        self._kernel: Any = None
        self._make: Callable[[], Any] | None = make
        self._typed = False

    @property
    def kernel(self) -> Any:
        """The ``cl.Kernel``, made at the first ask."""
        if self._kernel is None:
            assert self._make is not None
            self._kernel = self._make()
            self._make = None
        return self._kernel

    def __call__(self, queue: Any, global_size: Any, local_size: Any, *args: Any, **kwargs: Any) -> Any:
        kernel = self.kernel
        if not self._typed:
            kernel.set_scalar_arg_dtypes([a.dtype if isinstance(a, np.generic) else None for a in args])
            self._typed = True
        record = current_recording.get()
        if record is not None:
            if kwargs:  # wait_for and the like: not a launch a bound kernel repeats as it is
                record.refused = record.refused or "a launch with options"
            record.launches.append((kernel, global_size, local_size, args))
        LAUNCHED[0] += 1
        return kernel(queue, global_size, local_size, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernel, name)
