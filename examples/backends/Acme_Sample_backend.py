"""Acme's sample backend: a third-party flowrt backend in one file, written against the protocols.

It inherits from nothing in flowrt and imports only the answer types of ``flowrt.registry``.
Put this file's directory in ``FLOWRT_BACKEND_PATHS`` (or pass it as ``Runtime(backend_paths=
[...])``) and a runtime created afterwards registers it as ``Acme_Sample``::

    async with flowrt.Runtime(backend_paths=["/abs/path/to/examples/backends"]) as rt:
        opt = flowrt.optimize(net, backends=["Acme_Sample", "CpuRef"])
        model = await rt.load(opt)

It runs float32 Relu, Add and 2-D Conv (group 1, no dilation) with numpy, and declines every
other layer with a reason, so the optimizer hands those to the next backend in the list. Its
``optimize_subgraph`` offers one fusion: a Conv whose only reader is a Relu becomes one Conv
that applies the Relu as it writes its output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from flowrt.registry import FusedActivation, OptimizationViews, ReplacementLayer, Support, WorkloadInfo

BACKEND_ID = "Acme_Sample"


# -- the three functions flowrt looks for -------------------------------------------------------
def get_backend_id() -> str:
    """The id the backend is registered under (and the ``id`` of the objects it makes)."""
    return BACKEND_ID


def get_version() -> tuple[int, int]:
    """The flowrt Backend API this file was written against: same major, minor no greater."""
    return (1, 0)


def backend_factory() -> SampleBackend:
    """Called by the registry each time a backend object is needed; it is stateless."""
    return SampleBackend()


# -- kernels: called as kernel(descriptor, *inputs), return one array ---------------------------
def relu(desc: Any, x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0, dtype=x.dtype)


def add(desc: Any, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.add(a, b, dtype=a.dtype)


def conv2d(desc: Any, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """NCHW convolution as im2col + one matmul: every kernel window becomes a column."""
    top, left, bottom, right = (desc.pads or (0, 0, 0, 0)) if desc.auto_pad == "NOTSET" else (0, 0, 0, 0)
    stride_h, stride_w = desc.strides or (1, 1)
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    m, kh, kw = w.shape[0], w.shape[2], w.shape[3]
    # (N, C, OH, OW, KH, KW) -> columns (N, C*KH*KW, OH*OW)
    windows = sliding_window_view(padded, (kh, kw), axis=(2, 3))[:, :, ::stride_h, ::stride_w]
    n, c, oh, ow = windows.shape[:4]
    cols = windows.transpose(0, 1, 4, 5, 2, 3).reshape(n, c * kh * kw, oh * ow)
    y = np.matmul(w.reshape(m, -1), cols).reshape(n, m, oh, ow)
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y


KERNELS = {"Relu": relu, "Add": add, "Conv": conv2d}


# -- per-kind limits: what the kernels above do not cover -----------------------------------------
def add_support(descriptor: Any, inputs: Sequence[Any]) -> Support:
    """``add`` broadcasts as numpy does (opset 7 and later), not as the old ``broadcast``/``axis`` form."""
    if getattr(descriptor, "legacy", False):
        return Support.no("Acme_Sample does not run the pre-opset-7 broadcast form of Add")
    return Support.yes()


def conv_support(descriptor: Any, inputs: Sequence[Any]) -> Support:
    """Which Conv layers ``conv2d`` covers."""
    if inputs[0] is None or inputs[0].shape is None or len(inputs[0].shape) != 4:
        return Support.no("Acme_Sample runs 2-D convolutions (NCHW input) only")
    if descriptor.group != 1:
        return Support.no(f"Acme_Sample runs group 1 convolutions only, got group {descriptor.group}")
    if any(d != 1 for d in descriptor.dilations or ()):
        return Support.no(f"Acme_Sample runs undilated convolutions only, got {descriptor.dilations}")
    if descriptor.auto_pad not in ("NOTSET", "VALID"):
        return Support.no(f"Acme_Sample does not compute auto_pad {descriptor.auto_pad}")
    return Support.yes()


LIMITS = {"Add": add_support, "Conv": conv_support}


# -- the one fusion ------------------------------------------------------------------------------
def conv_relu(layer: Any, view: Any) -> Any:
    """The Relu that is the only reader of ``layer``, when ``layer`` is a Conv and both are in
    ``view`` (the layers handed to ``optimize_subgraph``); else None."""
    if layer.kind != "Conv" or len(layer.outputs[0].connections) != 1:
        return None
    reader = layer.outputs[0].connections[0].layer
    return reader if reader.kind == "Relu" and reader in view else None


# -- the protocol objects -----------------------------------------------------------------------
class SampleLayerSupport:
    """Relu, Add and plain Conv on float32; everything else declined with a reason (the
    optimizer records it and hands the layer to the next backend in the preference list)."""

    def is_layer_supported(
        self, kind: str, descriptor: Any, inputs: Sequence[Any], outputs: Sequence[Any]
    ) -> Support:
        if kind not in KERNELS:
            return Support.no(f"Acme_Sample has no kernel for {kind} (it runs {', '.join(KERNELS)})")
        for info in [*inputs, *outputs]:
            if info is not None and info.dtype.name != "FLOAT32":
                return Support.no(f"Acme_Sample runs float32 only, got {info.dtype.name}")
        return LIMITS[kind](descriptor, inputs) if kind in LIMITS else Support.yes()


class SampleWorkload:
    """One layer: its kernel and what it was built from. Holds nothing between runs."""

    def __init__(self, info: WorkloadInfo) -> None:
        self.info = info
        self.kernel = KERNELS[info.kind]

    def prepare(self) -> None:
        """One-time work at load; this backend has none (a real one would pack weights here)."""

    def execute(self, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        """Blocking; one array per input slot in, one per output out."""
        y = self.kernel(self.info.descriptor, *inputs)
        if self.info.activation is not None:  # a Relu fused by optimize_subgraph
            y = relu(None, y)
        return [y]


class SampleWorkloadFactory:
    def create_workload(self, info: WorkloadInfo) -> SampleWorkload:
        return SampleWorkload(info)


class SampleBackend:
    """The backend object: a stateless factory for everything above."""

    id = BACKEND_ID
    version = (1, 0)
    capabilities: dict[str, Any] = {"host_memory": True, "async_execution": False, "fp16": False}

    def layer_support(self) -> SampleLayerSupport:
        return SampleLayerSupport()

    def optimize_subgraph(self, view: Any) -> OptimizationViews:
        """Each Conv read only by a Relu (both in ``view``) is replaced by one Conv with the Relu
        fused; every other layer of the view stays untouched."""
        views = OptimizationViews()
        fused: set[str] = set()
        for layer in view:
            relu_layer = conv_relu(layer, view)
            if relu_layer is None:
                continue
            sources = [slot.source for slot in layer.inputs]
            replacement = ReplacementLayer(
                "Conv", layer.descriptor, sources, FusedActivation("Relu"), layer.name
            )
            views.add_substitution([layer, relu_layer], replacement)
            fused |= {layer.name, relu_layer.name}
        rest = [layer for layer in view if layer.name not in fused]
        if rest:
            views.add_untouched(rest)
        return views

    def create_memory_manager(self) -> None:
        """None: the runtime gives this backend plain host memory."""
        return None

    def create_workload_factory(self, memory_manager: Any) -> SampleWorkloadFactory:
        return SampleWorkloadFactory()
