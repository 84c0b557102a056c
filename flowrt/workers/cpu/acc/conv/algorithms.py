"""CpuAcc's conv algorithms, in the order they are tried, and how one is chosen for a shape.

As the Compute Library's ``NEConvolutionLayer`` picks among its functions, the first
algorithm whose ``applies(geometry, tuning)`` holds takes the shape; the order is part of
the rule (an algorithm's ``applies`` may leave out what an earlier one takes). ``Rows``
applies to every shape, so one is always found.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Protocol

import numpy as np

from flowrt.workers.cpu.acc.conv.batched import Batched
from flowrt.workers.cpu.acc.conv.columns import Columns, Rows
from flowrt.workers.cpu.acc.conv.depthwise import Depthwise, DepthwiseSame3
from flowrt.workers.cpu.acc.conv.depthwise_same5 import DepthwiseSame5
from flowrt.workers.cpu.acc.conv.depthwise_strided import DepthwiseStrided2
from flowrt.workers.cpu.acc.conv.depthwise_taps import DepthwiseVector
from flowrt.workers.cpu.acc.conv.few_pixels import FewPixels
from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
from flowrt.workers.cpu.acc.conv.grouped import Grouped
from flowrt.workers.cpu.acc.conv.grouped_same3 import GroupedSame3, GroupedStrided2
from flowrt.workers.cpu.acc.conv.packed import Packed
from flowrt.workers.cpu.acc.conv.taps import Taps
from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
from flowrt.workers.cpu.acc.conv.vector import Vector
from flowrt.workers.cpu.acc.conv.weights import ConvWeights
from flowrt.workers.cpu.acc.conv.windows import Windows
from flowrt.workers.cpu.acc.conv.winograd_conv import Winograd

# A conv's fused activation, (code, alpha, beta) as ``epilogue.activation_args`` gives them:
# a fixed-length tuple, which the algorithms spread into their kernels' arguments.
ActArgs = tuple[int, np.float32, np.float32]


class ConvAlgorithm(Protocol):
    """One way to compute a conv. The class says which shapes it takes (``applies``) and makes
    their plans (``plan``); a plan is a frozen instance holding only what its ``run`` needs
    (splits, chunk sizes, geometry arrays), made once per input shape and worker count. A plan
    whose ``run`` derives forms of the constant weights (panels, per-tap matrices, Winograd
    transforms) also has ``forms(weights, w, w_shape, bias, constant)``, which makes them
    without running (at load, where the layer does not run then)."""

    name: ClassVar[str]

    @classmethod
    def applies(cls, geometry: ConvGeometry, tuning: ConvTuning) -> bool:
        """Whether this algorithm takes ``geometry`` (the algorithms before it did not)."""
        ...

    @classmethod
    def plan(cls, geometry: ConvGeometry, tuning: ConvTuning) -> ConvAlgorithm:
        """The plan for ``geometry``."""
        ...

    def run(
        self,
        weights: ConvWeights,
        x: np.ndarray,
        w: np.ndarray,
        w_shape: tuple[int, ...],
        bias: np.ndarray,
        out: np.ndarray,
        finish: bool,
        constant: bool,
        act: ActArgs,
    ) -> None:
        """One call, blocking: ``out`` (N, M, oh, ow) from ``x`` (N, C, H, W), C-contiguous
        float32, and ``w``, the weights packed as ``ConvWeights.pack`` does (of shape
        ``w_shape`` before that); ``bias`` (M,) read-only, zeros when the layer has none;
        ``finish``: bias or activation to apply; ``constant``: ``w`` and ``bias`` are the
        layer's constants (what ``weights`` derives from them may be kept); ``act``: the
        activation's (code, alpha, beta)."""
        ...


ALGORITHMS: tuple[type[ConvAlgorithm], ...] = (
    DepthwiseVector,
    DepthwiseSame3,
    DepthwiseSame5,
    DepthwiseStrided2,
    Depthwise,
    GroupedSame3,
    GroupedStrided2,
    Grouped,
    Winograd,
    FewPixels,
    Taps,
    Vector,
    Batched,
    Packed,
    Windows,
    Columns,
    Rows,
)


# Where an algorithm would make a new form of a layer's constant weights and another one
# close behind it applies and reads a form that another load already made of them, the first
# gives way: (algorithm, the one it gives way to, the form that one reads). A network loaded at
# batch 1 and again at batch 4 (a batching stream's variants) runs ResNet-50's stride-1 3x3
# convs of 512 channels at 7x7 by the few-pixel tiles at batch 1, and would run them by
# Winograd at batch 4: 2.35 against 2.80 ms an image on one core (1-2% of the run), for 32 MiB
# more of transformed weights, a third of the model's weights. Its two stride-2 convs at 28x28
# (256 -> 256 3x3, 512 -> 1024 1x1) run by the column tiles at batch 1 and would run as one
# batched GEMM at batch 2 and more, which reads the weights as a plain matrix (4 MiB more), runs
# kernels only it uses (about 4 MiB of code loaded) and takes 7.7 MiB of scratch at batch 4: a
# batch-4 load beside the batch-1 one added 16.4 MiB beyond its arenas, 0.4-0.6 with the column
# tiles. Two workers, the two layers at batch 8: 11.1-11.5 and 9.2-9.8 ms batched against
# 11.8-14.0 and 10.7-12.3 by the column tiles (0.5-1% of the run); at batch 2 within 0.2 ms.
GIVES_WAY: tuple[tuple[type[ConvAlgorithm], type[ConvAlgorithm], str], ...] = (
    (Winograd, FewPixels, "conv.column_panels"),
    (Batched, Columns, "conv.panels"),
)


def choose(
    geometry: ConvGeometry, tuning: ConvTuning, made: Callable[[str], bool] = lambda form: False
) -> ConvAlgorithm:
    """The plan of the first algorithm of :data:`ALGORITHMS` that applies to ``geometry``, or
    of the one it gives way to (:data:`GIVES_WAY`) where ``made(form)`` says that the form
    that one reads of the constant weights is made already."""
    for algorithm in ALGORITHMS:
        if algorithm.applies(geometry, tuning):
            for first, other, form in GIVES_WAY:
                if algorithm is first and made(form) and other.applies(geometry, tuning):
                    return other.plan(geometry, tuning)
            return algorithm.plan(geometry, tuning)
    raise AssertionError("Rows applies to every conv")  # pragma: no cover
