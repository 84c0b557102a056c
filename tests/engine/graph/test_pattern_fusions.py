"""Activations and norms written out of small ops, as the torch exporters write them, become one
layer (pattern_fusions, norm_fusions): reported, and computing what onnxruntime computes."""

import math

import attrs
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import trio
from onnx import TensorProto, helper

import flowrt
from flowrt.engine.graph.optimizer import DATA_KINDS
from flowrt.engine.graph.passes.fusions import offer_fusions
from flowrt.engine.graph.passes.pattern_fusions import PATTERN_FUSIONS
from flowrt.engine.graph.subgraph import SubgraphView
from flowrt.registry import Support
from flowrt.workers.cpu.ref.backend import RefBackend

SHAPE = (2, 3, 8)
SQRT2 = 1.4142135623730951
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
GAMMA = np.linspace(0.5, 1.5, SHAPE[-1], dtype=np.float32)
BETA = np.linspace(-1, 1, SHAPE[-1], dtype=np.float32)


class Graph:
    """One ONNX graph over input ``x``: scalars become Constant nodes, arrays initializers."""

    def __init__(self, opset: int = 13) -> None:
        self.opset, self.nodes, self.initializers = opset, [], []

    def _input(self, value) -> str:
        if isinstance(value, str):
            return value
        name = f"c{len(self.nodes)}_{len(self.initializers)}"
        tensor = onnx.numpy_helper.from_array(np.asarray(value, np.float32), name)
        if np.ndim(value):
            self.initializers.append(tensor)
        else:
            self.nodes.append(helper.make_node("Constant", [], [name], value=tensor))
        return name

    def op(self, op_type: str, *inputs, **attributes) -> str:
        names = [self._input(i) for i in inputs]
        out = f"{op_type.lower()}{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, names, [out], name=out, **attributes))
        return out

    def first(self, op_type: str) -> str:
        """The output of the first ``op_type`` node (to read an intermediate elsewhere)."""
        return next(n.output[0] for n in self.nodes if n.op_type == op_type)

    def axes(self, axes: list[int]) -> str:
        """ReduceMean's axes input (opset 18 on)."""
        name = f"axes{len(self.initializers)}"
        self.initializers.append(onnx.numpy_helper.from_array(np.array(axes, np.int64), name))
        return name

    def model(self, *outputs: str, dtype=TensorProto.FLOAT) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            "pattern",
            [helper.make_tensor_value_info("x", dtype, SHAPE)],
            [helper.make_tensor_value_info(o, dtype, SHAPE) for o in outputs],
            self.initializers,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 8
        return model


def silu(g: Graph) -> str:
    return g.op("Mul", "x", g.op("Sigmoid", "x"))


def gelu_erf_torch(g: Graph, half: float = 0.5, root: float = SQRT2) -> str:
    """torch.onnx's nn.GELU before opset 20: 0.5 applied last."""
    erf = g.op("Erf", g.op("Div", "x", root))
    return g.op("Mul", g.op("Mul", "x", g.op("Add", erf, 1.0)), half)


def gelu_erf_half_first(g: Graph) -> str:
    """transformers' gelu: x * 0.5 * (1.0 + erf(x / sqrt(2)))."""
    half = g.op("Mul", "x", 0.5)
    return g.op("Mul", half, g.op("Add", g.op("Erf", g.op("Div", "x", SQRT2)), 1.0))


def gelu_erf_scaled(g: Graph) -> str:
    """x * ((1 + erf(x * 0.70710678)) * 0.5)."""
    erf = g.op("Erf", g.op("Mul", "x", 0.70710678))
    return g.op("Mul", "x", g.op("Mul", g.op("Add", 1.0, erf), 0.5))


def gelu_tanh_torch(g: Graph) -> str:
    """torch.onnx's nn.GELU(approximate="tanh") before opset 20: x * (x * x) for the cube."""
    cube = g.op("Mul", "x", g.op("Mul", "x", "x"))
    inner = g.op("Mul", SQRT_2_OVER_PI, g.op("Add", "x", g.op("Mul", 0.044715, cube)))
    return g.op("Mul", 0.5, g.op("Mul", "x", g.op("Add", 1.0, g.op("Tanh", inner))))


def gelu_tanh_pow(g: Graph) -> str:
    """transformers' NewGELU: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * pow(x, 3))))."""
    half = g.op("Mul", "x", 0.5)
    inner = g.op("Add", "x", g.op("Mul", g.op("Pow", "x", 3.0), 0.044715))
    return g.op("Mul", half, g.op("Add", g.op("Tanh", g.op("Mul", inner, SQRT_2_OVER_PI)), 1.0))


def hard_swish_sigmoid(g: Graph, alpha: float = 1 / 6) -> str:
    """torch.onnx's nn.Hardswish before opset 14."""
    return g.op("Mul", "x", g.op("HardSigmoid", "x", alpha=alpha))


def hard_swish_relu6(g: Graph) -> str:
    """x * F.relu6(x + 3) / 6, Clip's bounds as inputs (opset 11 on)."""
    clip = g.op("Clip", g.op("Add", "x", 3.0), 0.0, 6.0)
    return g.op("Div", g.op("Mul", "x", clip), 6.0)


def hard_swish_relu6_attributes(g: Graph) -> str:
    """x * (clip(x + 3, 0, 6) * (1 / 6)), Clip's bounds as attributes (opset 10)."""
    clip = g.op("Clip", g.op("Add", 3.0, "x"), min=0.0, max=6.0)
    return g.op("Mul", "x", g.op("Mul", clip, 1 / 6))


def layer_norm_torch(g: Graph) -> str:
    """torch.onnx's LayerNorm before opset 17."""
    centered = g.op("Sub", "x", g.op("ReduceMean", "x", axes=[-1]))
    variance = g.op("ReduceMean", g.op("Pow", centered, 2.0), axes=[-1])
    std = g.op("Sqrt", g.op("Add", variance, 1e-5))
    return g.op("Add", g.op("Mul", g.op("Div", centered, std), GAMMA), BETA)


def layer_norm_mul_self(g: Graph) -> str:
    """The square as Mul by itself, gamma first, no bias."""
    centered = g.op("Sub", "x", g.op("ReduceMean", "x", axes=[-1]))
    variance = g.op("ReduceMean", g.op("Mul", centered, centered), axes=[-1])
    return g.op("Mul", GAMMA, g.op("Div", centered, g.op("Sqrt", g.op("Add", 1e-12, variance))))


def rms_norm_llama(g: Graph, exponent: float = 2.0, axis: int = -1) -> str:
    """transformers' LlamaRMSNorm (rsqrt as Sqrt + Reciprocal), ReduceMean's axes as input."""
    variance = g.op("ReduceMean", g.op("Pow", "x", exponent), g.axes([axis]))
    inv = g.op("Reciprocal", g.op("Sqrt", g.op("Add", variance, 1e-6)))
    return g.op("Mul", GAMMA, g.op("Mul", "x", inv))


def rms_norm_div(g: Graph) -> str:
    """x / sqrt(mean(x * x) + eps) * gamma."""
    variance = g.op("ReduceMean", g.op("Mul", "x", "x"), axes=[-1])
    return g.op("Mul", g.op("Div", "x", g.op("Sqrt", g.op("Add", variance, 1e-5))), GAMMA)


def rms_norm_one_over(g: Graph) -> str:
    """x * (1 / sqrt(mean(x^2) + eps)) * gamma."""
    variance = g.op("ReduceMean", g.op("Pow", "x", 2.0), axes=[-1])
    inv = g.op("Div", 1.0, g.op("Sqrt", g.op("Add", variance, 1e-5)))
    return g.op("Mul", g.op("Mul", "x", inv), GAMMA)


Gelu, LayerNorm = flowrt.descriptors.Gelu, flowrt.descriptors.LayerNormalization
CASES = {
    "silu": (silu, 13, "Swish", flowrt.descriptors.Swish(alpha=1.0)),
    "gelu_erf_torch": (gelu_erf_torch, 13, "Gelu", Gelu("none")),
    "gelu_erf_half_first": (gelu_erf_half_first, 13, "Gelu", Gelu("none")),
    "gelu_erf_scaled": (gelu_erf_scaled, 13, "Gelu", Gelu("none")),
    "gelu_tanh_torch": (gelu_tanh_torch, 13, "Gelu", Gelu("tanh")),
    "gelu_tanh_pow": (gelu_tanh_pow, 13, "Gelu", Gelu("tanh")),
    "hard_swish_sigmoid": (hard_swish_sigmoid, 13, "HardSwish", flowrt.descriptors.HardSwish()),
    "hard_swish_relu6": (hard_swish_relu6, 13, "HardSwish", flowrt.descriptors.HardSwish()),
    "hard_swish_relu6_attributes": (hard_swish_relu6_attributes, 10, "HardSwish", flowrt.descriptors.HardSwish()),
    "layer_norm_torch": (layer_norm_torch, 13, "LayerNormalization", LayerNorm(axis=-1, epsilon=1e-5)),
    "layer_norm_mul_self": (layer_norm_mul_self, 13, "LayerNormalization", LayerNorm(axis=-1, epsilon=1e-12)),
    "rms_norm_llama": (rms_norm_llama, 18, "RMSNormalization", flowrt.descriptors.RMSNormalization(epsilon=1e-6)),
    "rms_norm_div": (rms_norm_div, 13, "RMSNormalization", flowrt.descriptors.RMSNormalization()),
    "rms_norm_one_over": (rms_norm_one_over, 13, "RMSNormalization", flowrt.descriptors.RMSNormalization()),
}  # fmt: skip


def pattern_model(name: str) -> onnx.ModelProto:
    build, opset, _, _ = CASES[name]
    g = Graph(opset)
    return g.model(build(g))


class FusingRef(RefBackend):
    """CpuRef's kernels, offering the pattern fusions: the matchers tested apart from which
    layers CpuAcc has kernels for."""

    id = "FusingRef"

    def optimize_subgraph(self, view):
        return offer_fusions(view, self.layer_support(), patterns=PATTERN_FUSIONS)


def fusing_registry():
    registry = flowrt.backend_registry().copy()
    registry.register("FusingRef", FusingRef)
    return registry


def run(opt: flowrt.OptimizedNetwork, x: np.ndarray, registry=None) -> list[np.ndarray]:
    async def main():
        async with flowrt.Runtime(registry, cpu_workers=1) as rt:
            outputs = await (await rt.load(opt, max_in_flight=1)).run({"x": x})
            return [outputs[name] for name in outputs]

    return trio.run(main)


def onnxruntime_outputs(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def data() -> np.ndarray:
    return (np.random.default_rng(5).standard_normal(SHAPE) * 3).astype(np.float32)


def check_fused(opt: flowrt.OptimizedNetwork, name: str, backend: str) -> None:
    """One substitution by ``backend`` into the case's layer, which ``flowrt inspect`` shows."""
    _, _, kind, descriptor = CASES[name]
    (record,) = opt.substitutions
    assert (record.backend, record.kind) == (backend, kind)
    got = opt.graph.layers[record.layer].descriptor
    if hasattr(descriptor, "epsilon"):  # read from a float32 constant
        assert got.epsilon == pytest.approx(descriptor.epsilon, rel=1e-6)
        got = attrs.evolve(got, epsilon=descriptor.epsilon)
    assert got == descriptor
    assert opt.assignments() == {record.layer: backend}  # the whole pattern is the one layer
    assert f"{backend}: " in opt.report() and f" -> {kind} {record.layer!r}" in opt.report()


@pytest.mark.parametrize("name", sorted(CASES))
def test_pattern_becomes_one_layer_computing_what_onnxruntime_does(name):
    model = pattern_model(name)
    registry = fusing_registry()
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["FusingRef"], registry=registry)
    check_fused(opt, name, "FusingRef")
    x = data()
    (got,) = run(opt, x, registry)
    np.testing.assert_allclose(got, onnxruntime_outputs(model, x)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_cpuacc_substitutes_the_pattern(name):
    model = pattern_model(name)
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["CpuAcc", "CpuRef"])
    check_fused(opt, name, "CpuAcc")
    x = data()
    (got,) = run(opt, x)
    np.testing.assert_allclose(got, onnxruntime_outputs(model, x)[0], rtol=1e-4, atol=1e-5)


class AcceptAll:
    """A layer support that takes every layer, so a matcher is tested on its own."""

    def is_layer_supported(self, kind, descriptor, inputs, outputs) -> Support:
        return Support.yes()


def offered(model: onnx.ModelProto) -> list[str]:
    """The kinds of the layers the pattern fusions offer for ``model``'s graph."""
    graph = flowrt.onnx.load(model).graph.copy()
    graph.validate()
    view = SubgraphView(graph, [layer for layer in graph if layer.kind not in DATA_KINDS])
    return [
        s.replacement.kind for s in offer_fusions(view, AcceptAll(), patterns=PATTERN_FUSIONS).substitutions
    ]


def test_every_case_is_offered_to_a_support_that_takes_everything():
    assert {name: offered(pattern_model(name)) for name in CASES} == {
        name: [kind] for name, (_, _, kind, _) in CASES.items()
    }


def test_intermediate_read_outside_the_pattern_is_not_fused():
    g = Graph()
    assert offered(g.model(silu(g), g.first("Sigmoid"))) == []
    g = Graph()
    assert offered(g.model(layer_norm_torch(g), g.first("Pow"))) == []


def test_centered_input_read_elsewhere_leaves_an_rms_norm_of_it():
    # x - mean(x) is needed outside: what follows it is an RMSNormalization of it, and the
    # Add of beta (which no RMSNormalization takes) stays.
    g = Graph()
    model = g.model(layer_norm_torch(g), g.first("Sub"))
    assert offered(model) == ["RMSNormalization"]
    registry = fusing_registry()
    opt = flowrt.optimize(flowrt.onnx.load(model), backends=["FusingRef"], registry=registry)
    assert "Add" in {layer.kind for layer in opt.graph}
    x = data()
    for got, expected in zip(run(opt, x, registry), onnxruntime_outputs(model, x), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "build",
    [
        lambda g: gelu_erf_torch(g, half=0.6),
        lambda g: gelu_erf_torch(g, root=math.sqrt(3)),
        lambda g: hard_swish_sigmoid(g, alpha=0.2),
        lambda g: rms_norm_llama(g, exponent=3.0),
        lambda g: rms_norm_llama(g, axis=1),
    ],
    ids=["gelu_half_0.6", "gelu_root_3", "hard_sigmoid_alpha_0.2", "rms_cube", "rms_middle_axis"],
)
def test_wrong_constant_is_not_fused(build):
    g = Graph(18)
    assert offered(g.model(build(g))) == []


def test_float64_pattern_is_not_fused():
    g = Graph()
    assert offered(g.model(silu(g), dtype=TensorProto.DOUBLE)) == []
