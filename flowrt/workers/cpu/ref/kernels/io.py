"""The Constant kernel: hands out its read-only array."""

from flowrt.workers.cpu.ref.kernels import ref_kernel


@ref_kernel("Constant")
def constant(desc):
    return desc.value
