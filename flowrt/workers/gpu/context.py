"""A device's OpenCL state shared by every GpuAcc workload on it: one per device per process."""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

from flowrt.workers.gpu.arena_cache import ArenaCache
from flowrt.workers.gpu.device import choose_device, cl, has_tensor_cores, new_context, takes_priority_hints
from flowrt.workers.gpu.launches import refuse
from flowrt.workers.gpu.program import ProgramCache
from flowrt.workers.gpu.scratch import ScratchSet, ScratchSets, current_scratch, map_pinned
from flowrt.workers.gpu.tensor import GpuTensor
from flowrt.workers.gpu.typed_kernel import TypedKernel


class DeviceContext:
    """An OpenCL context on one device, the in-order queue blocking workloads use, and the
    device's built programs.

    Building a context and its programs is the expensive part of GpuAcc's start, so backends
    (which are stateless and made afresh by the registry) share one through
    :func:`device_context`.
    """

    def __init__(self, device: Any) -> None:
        self.device = device
        self.context = new_context(device)  # the build probe's, where it made one
        self.queue = cl.CommandQueue(self.context, device)
        self.programs = ProgramCache(self.context, device)
        # Arena buffers no pool holds any more, for the next load (see ``allocator``).
        self.arena_cache = ArenaCache()
        # Kernels' temporaries, lent per submission (see ``scratch``).
        self.scratch_sets = ScratchSets(self.context, self.queue)
        # Device buffers of uploaded feeds, for later uploads: releasing a device buffer makes
        # NVIDIA's driver wait until the device is idle (every queue's work, other runs' too).
        self.upload_buffers = ArenaCache()
        self._priority_hints: bool | None = None
        self._tensor_cores: bool | None = None
        # The page-locked arrays ``pinned_array`` made, by id, while they live (see ``is_pinned``).
        self._pinned: dict[int, weakref.ref] = {}

    @property
    def priority_hints(self) -> bool:
        """Whether queues on this device take ``CL_QUEUE_PRIORITY_KHR`` (probed once)."""
        if self._priority_hints is None:
            self._priority_hints = takes_priority_hints(self.device, self.context)
        return self._priority_hints

    @property
    def tensor_cores(self) -> bool:
        """Whether half GEMMs run on this device's tensor cores (``has_tensor_cores``, read
        once: every GEMM a load makes asks)."""
        if self._tensor_cores is None:
            self._tensor_cores = has_tensor_cores(self.device)
        return self._tensor_cores

    def kernel(self, program: str, name: str, defines: str = "") -> TypedKernel:
        """A new kernel object for ``name`` in ``program`` built with ``defines`` (a
        ``cl.Kernel`` whose scalar argument types are declared at its first launch): its
        arguments are its own, so the caller must not share it between threads without a lock.
        The program builds in the background (``ProgramCache.request``); the kernel object is
        made when first used, waiting for the build then."""
        key = self.programs.request(program, defines)
        return TypedKernel(lambda: cl.Kernel(self.programs.get_key(key), name))

    def pinned_array(self, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        """A new C-contiguous array of page-locked host memory (``map_pinned``): a feed in it is
        uploaded, and an output bound to it downloaded, with no copy through staging."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        root = map_pinned(self.context, self.queue, nbytes)
        key = id(root)

        def forget(_: Any) -> None:
            self._pinned.pop(key, None)

        self._pinned[key] = weakref.ref(root, forget)
        return root[:nbytes].view(dtype).reshape(shape)

    def is_pinned(self, array: np.ndarray) -> bool:
        """Whether ``array`` is (a view of) one of this device's ``pinned_array`` arrays."""
        if not self._pinned:  # none made: every feed and output of a run asks
            return False
        root = array
        while isinstance(root.base, np.ndarray):
            root = root.base
        found = self._pinned.get(id(root))
        return found is not None and found() is root

    def empty(self, shape: tuple[int, ...], dtype: Any = np.float32) -> GpuTensor:
        """An uninitialized device tensor."""
        nbytes = max(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize, 1)
        return GpuTensor(cl.Buffer(self.context, cl.mem_flags.READ_WRITE, nbytes), shape, dtype, self.queue)

    def scratch(self, shape: tuple[int, ...], slot: int = 0, dtype: Any = np.float32) -> GpuTensor:
        """A device tensor for a kernel's temporary values, valid until the kernels of the
        current submission have run: slot ``slot`` of the submission's scratch set (a later
        kernel of the submission reuses it), or a new buffer outside any submission."""
        lent = self._lent_scratch()
        if lent is None:
            return self.empty(shape, dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return GpuTensor(lent.take(nbytes, slot), shape, dtype, self.queue)

    def _lent_scratch(self) -> ScratchSet | None:
        """The scratch set of the submission being enqueued on this device, if any."""
        lent = current_scratch.get()
        return lent if lent is not None and lent.context is self.context else None

    def upload(self, array: Any, dtype: Any = None) -> GpuTensor:
        """A device copy of a host array, as ``dtype`` (see ``enqueue_upload``); blocks until
        the copy is done."""
        tensor, event = self.enqueue_upload(self.queue, array, dtype)
        if event is not None:
            event.wait()
        return tensor

    def enqueue_upload(self, queue: Any, array: Any, dtype: Any = None) -> tuple[GpuTensor, Any]:
        """A device copy of a host array, as ``dtype``, enqueued on ``queue`` without waiting;
        returns it and the copy's event (None when there was nothing to copy). Keep the event
        until it completes: it holds the host bytes the copy reads. By default float16 stays
        half (a float16 layer's weights, or a host backend's tensor it reads) and anything
        else goes as float32. Inside a submission, an array of ``pinned_array`` (of the right
        dtype) is read where it is; any other is copied into pinned staging first."""
        refuse("an upload")
        source = np.asarray(array)
        if dtype is None:
            dtype = np.float16 if source.dtype == np.float16 else np.float32
        host = np.ascontiguousarray(source, dtype=dtype)
        lent = self._lent_scratch()
        if not host.size:
            return self.empty(host.shape, host.dtype), None
        if lent is None:  # a constant at load, say: a buffer of its own
            tensor = self.empty(host.shape, host.dtype)
            return tensor, cl.enqueue_copy(queue, tensor.buffer, host, is_blocking=False)  # its own: offset 0
        # A run's feed: a cached device buffer, filled through pinned staging.
        cached = self.upload_buffers.take(host.nbytes)
        buffer = cached[0] if cached else cl.Buffer(self.context, cl.mem_flags.READ_WRITE, host.nbytes)
        tensor = GpuTensor(buffer, host.shape, host.dtype, self.queue)
        # Back to the cache (never released) when the tensor is dropped: the executor keeps it
        # with the copy's event until the submission has finished, so no command reads it then.
        weakref.finalize(tensor, self.upload_buffers.give, buffer, {})
        return tensor, self._from_host(queue, tensor, host, lent)

    def enqueue_write(self, queue: Any, tensor: GpuTensor, array: np.ndarray) -> Any:
        """Copy the host ``array`` (C-contiguous, as many bytes as ``tensor``) into ``tensor``,
        enqueued on ``queue``; returns the copy's event. Inside a submission as a feed's upload
        goes, outside one a blocking copy."""
        refuse("an upload")
        lent = self._lent_scratch()
        if lent is None:
            return cl.enqueue_copy(queue, tensor.buffer, array, dst_offset=tensor.offset, is_blocking=True)
        return self._from_host(queue, tensor, array, lent)

    def _from_host(self, queue: Any, tensor: GpuTensor, host: np.ndarray, lent: ScratchSet) -> Any:
        """A submission's copy of ``host`` into ``tensor``: straight from a ``pinned_array``
        array, else through the submission's pinned staging."""
        source = host
        if not self.is_pinned(host):
            source = lent.stage(host.nbytes)
            np.copyto(source, host.reshape(-1).view(np.uint8))
        return cl.enqueue_copy(queue, tensor.buffer, source, dst_offset=tensor.offset, is_blocking=False)

    def enqueue_download(
        self, queue: Any, tensor: GpuTensor, into: np.ndarray | None = None
    ) -> tuple[np.ndarray, Any]:
        """A host array that will hold ``tensor`` once the returned event has completed (keep
        the event until then); inside a submission, once the submission has finished. The
        array is ``into`` (C-contiguous, of the tensor's shape and dtype) when given, else new."""
        refuse("a download")
        lent = self._lent_scratch()
        # Outside a submission, or into a page-locked array: the device writes it directly.
        if lent is None or not tensor.size or (into is not None and self.is_pinned(into)):
            return tensor.enqueue_read(queue, into)
        host = np.empty(tensor.shape, tensor.dtype) if into is None else into
        staged = lent.stage(tensor.nbytes)
        event = cl.enqueue_copy(queue, staged, tensor.buffer, src_offset=tensor.offset, is_blocking=False)
        lent.copy_after(host.reshape(-1).view(np.uint8), staged)
        return host, event


_contexts: dict[int, DeviceContext] = {}
_lock = threading.Lock()


def device_context(spec: str | None = None) -> DeviceContext:
    """The process's DeviceContext for the device ``spec`` names (see ``choose_device``)."""
    device = choose_device(spec)
    with _lock:
        found = _contexts.get(device.int_ptr)
        if found is None:
            found = _contexts[device.int_ptr] = DeviceContext(device)
        return found
