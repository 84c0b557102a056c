"""BitwiseAnd, BitwiseOr, BitwiseXor (broadcasting) and BitwiseNot on integer tensors."""

from __future__ import annotations

from flowrt.engine.graph.layer_kind import layer_kind
from flowrt.engine.graph.layers.elementwise import INT_TYPES, binary_infer, same_info_infer

layer_kind(["BitwiseAnd", "BitwiseOr", "BitwiseXor"], min_inputs=2, max_inputs=2)(binary_infer(INT_TYPES))
layer_kind("BitwiseNot")(same_info_infer(INT_TYPES))
