"""Run float32 layers in float16 on backends that declare it (Arm NN's ReduceFp32ToFp16).

A layer assigned to a backend with capability ``fp16`` True, whose tensors are all float32
(constant non-float inputs aside, such as a Reshape's shape) and which that backend supports
in float16, is converted: its float32 constants (weights) are stored as float16 and Cast
layers are inserted where float32 data enters or leaves the converted layers, so the rest of
the network, and the caller, still see float32.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flowrt.engine.graph.graph import Graph, InputSlot, Layer, OutputSlot, constant_value
from flowrt.engine.graph.layers.elementwise import CastDescriptor
from flowrt.engine.graph.passes.fold_batch_norm import constant_slot
from flowrt.registry import LayerSupport
from flowrt.types import DataType

ONNX_FLOAT, ONNX_FLOAT16 = 1, 10
F32, F16 = DataType.FLOAT32, DataType.FLOAT16

# place_cast(cast layer, backend of the converted layer) assigns the new Cast to a backend.
PlaceCast = Callable[[Layer, str], None]


def _half(info: Any) -> Any:
    return info.with_dtype(F16) if info is not None and info.dtype is F32 else info


def _convertible(layer: Layer, support: LayerSupport) -> bool:
    outputs = [o.info for o in layer.outputs]
    inputs = [
        s.source.info if s.source is not None and constant_value(s.source) is None else None
        for s in layer.inputs
    ]
    if not outputs or any(o is None or o.dtype is not F32 for o in outputs):
        return False
    if any(i is not None and i.dtype is not F32 for i in inputs):
        return False
    halves = [_half(i) for i in layer.input_infos]
    return support.is_layer_supported(
        layer.kind, layer.descriptor, halves, [_half(o) for o in outputs]
    ).supported


def _cast(graph: Graph, source: OutputSlot, to: int, name: str) -> Layer:
    cast = graph.add_layer("Cast", CastDescriptor(to=to), name=name)
    source.connect(cast.inputs[0])
    assert source.info is not None  # a float32 tensor of a converted layer
    cast.outputs[0].info = source.info.with_dtype(F16 if to == ONNX_FLOAT16 else F32)
    return cast


def _convert_inputs(graph: Graph, layer: Layer, converted: set[str], place: PlaceCast, made: dict) -> None:
    """Feed ``layer`` float16: weights converted once, other float32 sources through one Cast."""
    for slot in layer.inputs:
        source = slot.source
        if (
            source is None
            or source.info is None
            or source.info.dtype is not F32
            or source.layer.name in converted
        ):
            continue
        key = (source.layer.name, source.index)
        if key not in made:
            value = constant_value(source)
            if value is not None:
                made[key] = constant_slot(graph, f"{source.layer.name}/fp16", value.astype("float16"))
            else:
                cast = _cast(graph, source, ONNX_FLOAT16, f"{source.layer.name}/to_fp16")
                assert layer.backend is not None  # only assigned layers are converted
                place(cast, layer.backend)
                made[key] = cast.outputs[0]
        source.disconnect(slot)
        made[key].connect(slot)


def _convert_outputs(graph: Graph, layer: Layer, converted: set[str], place: PlaceCast) -> None:
    """Give readers outside the converted layers float32 again, through one Cast per output."""
    for out in layer.outputs:
        outside: list[InputSlot] = [d for d in out.connections if d.layer.name not in converted]
        if not outside:
            continue
        for destination in outside:
            out.disconnect(destination)
        # The output becomes float16 (shape inference says so at the end): the Cast's backend
        # is chosen for a float16 input.
        out.info = _half(out.info)
        cast = _cast(graph, out, ONNX_FLOAT, f"{layer.name}/to_fp32")
        assert layer.backend is not None  # only assigned layers are converted
        place(cast, layer.backend)
        for destination in outside:
            cast.outputs[0].connect(destination)


def reduce_fp32_to_fp16(
    graph: Graph,
    supports: Mapping[str, LayerSupport],
    capabilities: Mapping[str, Mapping[str, Any]],
    place: PlaceCast,
) -> list[str]:
    """Convert the layers of fp16 backends (see the module docstring); return the changes."""
    fp16 = {bid for bid, caps in capabilities.items() if caps.get("fp16")}
    layers = [
        layer
        for layer in graph.topological_order()
        if layer.backend in fp16 and _convertible(layer, supports[layer.backend])
    ]
    converted = {layer.name for layer in layers}
    made: dict[tuple[str, int], OutputSlot] = {}
    for layer in layers:
        _convert_outputs(graph, layer, converted, place)
    for layer in layers:
        _convert_inputs(graph, layer, converted, place, made)
    graph.remove_unread_constants()
    graph.infer_shapes()
    return [f"reduced {layer.kind} {layer.name!r} on {layer.backend} to float16" for layer in layers]
