"""BatchNormalization (inference), LRN, Softmax, AttentionSoftmax, LayerNormalization and
RMSNormalization."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flowrt.registry import Support, WorkloadInfo
from flowrt.workers.gpu.kernels import (
    ROW_GROUP_MIN,
    GpuKernel,
    activation_args,
    fold_dims,
    gpu_kernel,
    ints,
    row_group,
    static_shape,
)
from flowrt.workers.gpu.kernels.elementwise import broadcast_strides
from flowrt.workers.gpu.tensor import GpuTensor


def channel_layout(shape: Sequence[int]) -> tuple[int, int]:
    """(channels, cells per channel) of an N, C, ... tensor."""
    return shape[1], int(np.prod(shape[2:], dtype=np.int64))


@gpu_kernel("BatchNormalization")
class BatchNormalizationKernel(GpuKernel):
    """y = act(x * factor[c] + shift[c]), the four parameters folded on the host (at load when
    they are constants, as they are in every exported model)."""

    host_inputs = frozenset({1, 2, 3, 4})
    fuses_activation = True
    half_storage = True

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        desc = info.descriptor
        if desc.training or len(info.outputs) != 1:
            return Support.no("GpuAcc runs BatchNormalization in inference mode only")
        if not desc.spatial:
            return Support.no("GpuAcc runs per-channel (spatial) BatchNormalization only")
        return Support.yes()

    def prepare(self) -> None:
        self.kernel = self.context.kernel("normalization", "scale_shift", self.storage)
        params = [self.constant(i) for i in range(1, 5)]
        self.folded = self._fold(params) if all(p is not None for p in params) else None

    def _fold(self, params: Sequence[Any]) -> tuple[GpuTensor, GpuTensor]:
        scale, bias, mean, var = (np.asarray(p, np.float32).reshape(-1) for p in params)
        factor = scale / np.sqrt(var + np.float32(self.info.descriptor.epsilon))
        return self.context.upload(factor), self.context.upload(bias - mean * factor)

    def enqueue(self, queue: Any, inputs: Sequence[Any], outputs: Sequence[GpuTensor]) -> Any:
        x, y = inputs[0], outputs[0]
        factor, shift = self.folded or self._fold(inputs[1:5])
        return self.launch(self.kernel, queue, x.size, *x.kernel_args, *y.kernel_args, *factor.kernel_args, *shift.kernel_args,
            *ints(*channel_layout(x.shape), x.size), *activation_args(self.info.activation),
        )  # fmt: skip


@gpu_kernel("LRN")
class LRNKernel(GpuKernel):
    """Local response normalization across channels."""

    def prepare(self) -> None:
        self.kernel = self.context.kernel("normalization", "lrn")

    def enqueue(self, queue: Any, inputs: Sequence[GpuTensor], outputs: Sequence[GpuTensor]) -> Any:
        x, y, desc = inputs[0], outputs[0], self.info.descriptor
        channels, inner = channel_layout(x.shape)
        return self.launch(self.kernel, queue, x.size, *x.kernel_args, *y.kernel_args,
            *ints(channels, inner, desc.size), np.float32(desc.alpha / desc.size),
            np.float32(desc.beta), np.float32(desc.bias), np.int32(x.size),
        )  # fmt: skip


@gpu_kernel("Softmax")
class SoftmaxKernel(GpuKernel):
    """Softmax along an axis (through the 2-D view before opset 13), shifted by the row max."""

    half_storage = True

    def prepare(self) -> None:
        shape = self.output_shapes[0]
        desc = self.info.descriptor
        axis = desc.resolved_axis(len(shape), "Softmax")
        if desc.coerces_to_2d:
            length, inner = int(np.prod(shape[axis:], dtype=np.int64)), 1
        else:
            length, inner = shape[axis], int(np.prod(shape[axis + 1 :], dtype=np.int64))
        self.rows = int(np.prod(shape, dtype=np.int64)) // max(length, 1)
        # A row of the last axis is contiguous: a work-group per row where it is long enough.
        self.group = row_group(length, self.context.device) if inner == 1 else None
        if self.group is not None:
            self.kernel = self.context.kernel("reduction", "softmax_rows", self.storage)
            self.args = ints(length, self.rows)
        else:
            self.kernel = self.context.kernel("normalization", "softmax", self.storage)
            self.args = ints(length, inner, self.rows)

    def enqueue(self, queue: Any, inputs: Sequence[GpuTensor], outputs: Sequence[GpuTensor]) -> Any:
        x, y = inputs[0], outputs[0]
        return self.launch_rows(
            self.kernel, queue, self.rows, self.group, *x.kernel_args, *y.kernel_args, *self.args
        )


def mask_layout(x_shape: Sequence[int], mask_shape: Sequence[int]) -> tuple[list[int], list[int], int] | None:
    """How a mask broadcast to ``x_shape`` is read row by row: (the sizes and the mask's
    element strides of three leading dims, whose product is x's rows; the stride along a row,
    0 or 1); None where its leading dims do not collapse to three. A broadcast dim has stride 0."""
    strides = broadcast_strides(mask_shape, x_shape, rank=len(x_shape))
    runs = fold_dims(x_shape[:-1], strides[:-1])
    if len(runs) > 3:
        return None
    runs = [(1, 0)] * (3 - len(runs)) + runs
    return [size for size, _ in runs], [stride for _, stride in runs], strides[-1]


@gpu_kernel("AttentionSoftmax")
class AttentionSoftmaxKernel(GpuKernel):
    """softmax(scale * X + mask) along the last axis: a work-group per row, the mask read
    through broadcast strides (:func:`mask_layout`)."""

    half_storage = True

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        if len(info.inputs) > 1 and info.inputs[1] is not None:
            x, mask = static_shape(info.inputs[0]), static_shape(info.inputs[1])
            if mask_layout(x, mask) is None:
                return Support.no(
                    f"GpuAcc's AttentionSoftmax reads a mask whose broadcast over X's leading dims "
                    f"folds into three runs of strides; got a mask of shape {mask} for X of shape {x}"
                )
        return Support.yes()

    def prepare(self) -> None:
        shape = static_shape(self.info.inputs[0])
        length = shape[-1]
        self.rows = int(np.prod(shape[:-1], dtype=np.int64))
        # Every row takes a work-group: a short row one of the power of two at most its length.
        short = 1 << (max(min(length, ROW_GROUP_MIN - 1), 1).bit_length() - 1)
        self.group = row_group(length, self.context.device) or short
        self.kernel = self.context.kernel("reduction", "attention_softmax_rows", self.storage)
        has_mask = len(self.info.inputs) > 1 and self.info.inputs[1] is not None
        sizes, strides, along = [1, 1, 1], [0, 0, 0], 0
        if has_mask:
            layout = mask_layout(shape, static_shape(self.info.inputs[1]))
            assert layout is not None  # supports() declines the others
            sizes, strides, along = layout
        self.has_mask = has_mask
        self.args = (
            *ints(int(has_mask), sizes[1], sizes[2], *strides, along),
            np.float32(self.info.descriptor.scale),
            *ints(length, self.rows),
        )

    def enqueue(self, queue: Any, inputs: Sequence[Any], outputs: Sequence[GpuTensor]) -> Any:
        x, y = inputs[0], outputs[0]
        mask = inputs[1] if self.has_mask else x
        return self.launch_rows(
            self.kernel,
            queue,
            self.rows,
            self.group,
            *x.kernel_args,
            *y.kernel_args,
            *mask.kernel_args,
            *self.args,
        )


@gpu_kernel("LayerNormalization")
class LayerNormalizationKernel(GpuKernel):
    """Each row of the dims from ``axis`` on standardized, then scaled and shifted; the
    optional Mean and InvStdDev outputs hold each row's statistics."""

    half_storage = True
    center = True  # subtract each row's mean (RMSNormalization does not)

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        shape = static_shape(info.inputs[0])
        axis = info.descriptor.axis % len(shape)
        size = int(np.prod(shape[axis:], dtype=np.int64))
        for what, param in zip(("scale", "bias"), info.inputs[1:], strict=False):
            if param is not None and param.num_elements not in (1, size):
                return Support.no(
                    f"GpuAcc's {info.kind} takes a {what} of 1 or {size} values, got shape {param.shape}"
                )
        return Support.yes()

    def prepare(self) -> None:
        shape = static_shape(self.info.inputs[0])
        axis = self.info.descriptor.axis % len(shape)
        self.size = int(np.prod(shape[axis:], dtype=np.int64))
        self.rows = int(np.prod(shape[:axis], dtype=np.int64))
        self.group = row_group(self.size, self.context.device)
        name = "layer_norm" if self.group is None else "layer_norm_rows"
        self.kernel = self.context.kernel("reduction", name, self.storage)

    def enqueue(self, queue: Any, inputs: Sequence[Any], outputs: Sequence[GpuTensor]) -> Any:
        x, scale, *rest = inputs
        bias = rest[0] if rest else None
        y, stats = outputs[0], list(outputs[1:3])
        mean, inv_std = (stats + [y, y])[:2]
        return self.launch_rows(
            self.kernel, queue, self.rows, self.group, *x.kernel_args, *y.kernel_args,
            *scale.kernel_args, np.int32(scale.size > 1),
            *(scale if bias is None else bias).kernel_args, np.int32(bias is not None and bias.size > 1), np.int32(bias is not None),
            *mean.kernel_args, *inv_std.kernel_args, np.int32(len(stats)),
            *ints(self.center, self.size, self.rows), np.float32(self.info.descriptor.epsilon),
        )  # fmt: skip


@gpu_kernel("RMSNormalization")
class RMSNormalizationKernel(LayerNormalizationKernel):
    """Each row of the dims from ``axis`` on divided by its root mean square, then scaled:
    LayerNormalization's kernels without the mean (the fused form of LLaMA's and T5's norms,
    see ``norm_fusions``)."""

    center = False

    @classmethod
    def supports(cls, info: WorkloadInfo) -> Support:
        x, scale = info.inputs[:2]
        if x is not None and scale is not None and x.dtype is not scale.dtype:
            return Support.no(
                f"GpuAcc's RMSNormalization takes a scale of its input's type ({x.dtype.value}), "
                f"got {scale.dtype.value}"
            )
        return super().supports(info)
