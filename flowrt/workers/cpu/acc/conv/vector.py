"""A 1x1 conv on a 1x1 plane (squeeze-excitation, a classifier written as a conv): for each
image, weights (M, C) times a vector of C, by ``gemv.py``. Its algorithm is :class:`Vector`."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import attrs
import numpy as np

from flowrt.workers.cpu.acc.gemv import MAX_VECTORS, gemv, row_bounds

if TYPE_CHECKING:
    from flowrt.workers.cpu.acc.conv.algorithms import ActArgs
    from flowrt.workers.cpu.acc.conv.geometry import ConvGeometry
    from flowrt.workers.cpu.acc.conv.tuning import ConvTuning
    from flowrt.workers.cpu.acc.conv.weights import ConvWeights


@attrs.frozen(eq=False)
class Vector:
    """Plan of a 1x1 stride-1 unpadded ungrouped conv of one output pixel per image, over at
    most :data:`MAX_VECTORS` images: ``bounds`` split the output channels over the workers."""

    name: ClassVar[str] = "vector"
    bounds: np.ndarray

    @classmethod
    def applies(cls, geometry: ConvGeometry, tuning: ConvTuning) -> bool:
        """A direct conv whose output is one pixel per image, of few images."""
        return (
            geometry.direct
            and geometry.groups == 1
            and geometry.pixels == 1
            and geometry.x_shape[0] <= MAX_VECTORS
        )

    @classmethod
    def plan(cls, geometry: ConvGeometry, tuning: ConvTuning) -> Vector:
        """The output channels split where the weights are enough to keep the workers busy."""
        return cls(row_bounds(geometry.mg, geometry.rows, geometry.workers))

    def run(
        self, weights: ConvWeights, x, w, w_shape, bias, out, finish: bool, constant: bool, act: ActArgs
    ) -> None:
        """See ``algorithms.ConvAlgorithm.run``."""
        gemv(w[0], x.reshape(x.shape[0], -1), bias, out.reshape(out.shape[0], -1), self.bounds, *act)
