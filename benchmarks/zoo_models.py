"""The model zoo's architectures, built with seeded random weights, and their export to ONNX.

Nothing is downloaded: torchvision models are built with ``weights=None`` and transformers
models from configs. Normalization layers get random statistics and affine parameters too, so
that batch-norm folding and LayerNormalization are checked on values that matter (a fresh
BatchNorm is the identity). This module imports torch only inside the functions that need it,
so that ``zoo.py`` can time the exported files in a process that never loads torch.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SEED = 0
TORCHSCRIPT_OPSET = 17
DYNAMO_OPSET = 18  # the dynamo exporter's own opset; it converts to others only by a version converter
EXPORTERS = ("torchscript", "dynamo")


@dataclass(frozen=True)
class InputSpec:
    """One model input: ``kind`` is "float" (standard normal), "tokens" (ids below ``high``)
    or "mask" (an attention mask: ones, the last quarter zeros)."""

    name: str
    shape: tuple[int, ...]
    kind: str = "float"
    high: int = 0


@dataclass(frozen=True)
class ZooModel:
    """An architecture of the zoo: ``builder`` names a function of this module that returns
    the torch module (in eval mode) from ``options``."""

    name: str
    builder: str
    inputs: tuple[InputSpec, ...]
    options: tuple[tuple[str, Any], ...] = ()

    def build(self) -> Any:
        import torch

        torch.manual_seed(SEED)
        module = globals()[self.builder](**dict(self.options))
        _randomize_norms(module)
        return module.eval()


def make_feeds(inputs: tuple[InputSpec, ...], seed: int = SEED) -> dict[str, np.ndarray]:
    """Seeded inputs for a model, as numpy arrays (float32, or int64 for tokens and masks)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in inputs:
        if spec.kind == "tokens":
            feeds[spec.name] = rng.integers(0, spec.high, spec.shape, dtype=np.int64)
        elif spec.kind == "mask":
            mask = np.ones(spec.shape, np.int64)
            mask[..., spec.shape[-1] - spec.shape[-1] // 4 :] = 0
            feeds[spec.name] = mask
        else:
            feeds[spec.name] = rng.standard_normal(spec.shape).astype(np.float32)
    return feeds


def _image(size: int = 224, channels: int = 3) -> tuple[InputSpec, ...]:
    return (InputSpec("image", (1, channels, size, size)),)


def _text(vocab: int, length: int) -> tuple[InputSpec, ...]:
    # Decoders get a mask too: without one, transformers looks for packed sequences with
    # torch.diff, which the TorchScript exporter has no ONNX for.
    return (
        InputSpec("input_ids", (1, length), "tokens", vocab),
        InputSpec("attention_mask", (1, length), "mask"),
    )


def _vision(name: str) -> ZooModel:
    return ZooModel(name, "torchvision_model", _image(), (("arch", name),))


def _hf(name: str, config: str, inputs: tuple[InputSpec, ...], fields: dict[str, Any]) -> ZooModel:
    return ZooModel(
        name, "transformers_model", inputs, (("config", config), ("fields", tuple(fields.items())))
    )


_SMALL = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024}
_LLAMA = {**_SMALL, "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 688}
_TINY_BERT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}

ZOO = {
    m.name: m
    for m in (
        _vision("mobilenet_v2"),  # depthwise
        _vision("mobilenet_v3_small"),  # depthwise, squeeze-excitation, hardswish
        _vision("efficientnet_b0"),  # depthwise, squeeze-excitation, SiLU
        _vision("mnasnet0_5"),
        _vision("shufflenet_v2_x1_0"),  # channel shuffle
        _vision("regnet_y_400mf"),  # grouped convs, squeeze-excitation
        _vision("resnet18"),
        _vision("resnet50"),  # bottlenecks; the int8 benchmark's CNN
        _vision("convnext_tiny"),  # 7x7 depthwise, LayerNorm over channels, GELU
        _vision("swin_t"),  # shifted windows: Roll, window partition reshapes, masks
        ZooModel("vit_small", "torchvision_vit", _image(), (("layers", 4), ("heads", 4), ("width", 256))),
        _hf("bert_small", "BertConfig", _text(30522, 128), _SMALL),
        _hf(
            "distilbert_small",
            "DistilBertConfig",
            _text(30522, 128),
            dict(dim=256, n_layers=4, n_heads=4, hidden_dim=1024),
        ),
        _hf(
            "gpt2_small",
            "GPT2Config",
            _text(50257, 128),
            dict(n_embd=256, n_layer=4, n_head=4, n_positions=128),
        ),
        _hf("llama_small", "LlamaConfig", _text(32000, 128), _LLAMA),  # RMSNorm, rotary, grouped KV heads
        ZooModel("unet", "unet", _image(128), (("base", 16),)),
        ZooModel("mlp", "mlp", (InputSpec("x", (16, 784)),), (("widths", (2048, 2048, 1024, 10)),)),
        ZooModel("lstm", "lstm", (InputSpec("x", (1, 64, 128)),), (("hidden", 256), ("layers", 2))),
    )
}

# Shrunk relatives of the zoo, small enough to commit (tests/integration/zoo/): each .onnx is
# 50-140 KB, and flowrt runs them in milliseconds.
TEST_MODELS = {
    m.name: m
    for m in (
        ZooModel("tiny_mobilenet", "tiny_mobilenet", _image(32), (("width", 16),)),
        _hf(
            "tiny_bert",
            "BertConfig",
            _text(100, 16),
            dict(vocab_size=100, max_position_embeddings=32, **_TINY_BERT),
        ),
        _hf(
            "tiny_gpt2",
            "GPT2Config",
            _text(100, 16),
            dict(
                vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=32, bos_token_id=0, eos_token_id=0
            ),
        ),
        ZooModel("tiny_unet", "unet", _image(32), (("base", 4),)),
    )
}


def _randomize_norms(module: Any) -> None:
    import torch

    norms = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm)
    with torch.no_grad():
        for m in module.modules():
            is_rms = type(m).__name__.endswith("RMSNorm")
            if not (isinstance(m, norms) or is_rms) or getattr(m, "weight", None) is None:
                continue
            m.weight.uniform_(0.5, 1.5)
            if getattr(m, "bias", None) is not None:
                m.bias.normal_(0.0, 0.1)
            if getattr(m, "running_mean", None) is not None:
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 2.0)


# --- builders: each returns a torch module; torch is imported here only ----------------------


def torchvision_model(arch: str) -> Any:
    import torchvision

    return torchvision.models.get_model(arch, weights=None)


def torchvision_vit(layers: int, heads: int, width: int) -> Any:
    import torch
    from torchvision.models import VisionTransformer

    model = VisionTransformer(224, 16, layers, heads, hidden_dim=width, mlp_dim=4 * width)
    # torchvision zeroes the head, which would make every output 0 and the check vacuous.
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)
    return model


def transformers_model(config: str, fields: tuple[tuple[str, Any], ...]) -> Any:
    import torch
    import transformers

    cfg = getattr(transformers, config)(**dict(fields))
    cfg.use_cache = False
    model = transformers.AutoModel.from_config(cfg, attn_implementation="eager")

    class FirstOutput(torch.nn.Module):
        """The last hidden state alone, from keyword inputs (GPT-2's second positional
        argument is the past key values)."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask=None):
            kwargs = {} if attention_mask is None else {"attention_mask": attention_mask}
            return self.model(input_ids=input_ids, return_dict=False, **kwargs)[0]

    return FirstOutput()


def _conv_bn(torch: Any, cin: int, cout: int, groups: int = 1, act: Any = None) -> Any:
    nn = torch.nn
    conv = nn.Conv2d(cin, cout, 3, padding=1, groups=groups, bias=False)
    return nn.Sequential(conv, nn.BatchNorm2d(cout), act or nn.ReLU())


def unet(base: int) -> Any:
    """A three-level U-Net: Conv/BN/ReLU pairs, MaxPool down; up by ConvTranspose, bilinear and
    nearest resizes (F.interpolate); skips joined by Concat."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(_conv_bn(torch, cin, cout), _conv_bn(torch, cout, cout))

    class UNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            c = [base, base * 2, base * 4, base * 8]
            self.downs = nn.ModuleList([block(3, c[0]), block(c[0], c[1]), block(c[1], c[2])])
            self.bottom = block(c[2], c[3])
            self.up_transposed = nn.ConvTranspose2d(c[3], c[2], 2, stride=2)
            self.ups = nn.ModuleList(
                [block(c[2] * 2, c[2]), block(c[2] + c[1], c[1]), block(c[1] + c[0], c[0])]
            )
            self.head = nn.Conv2d(c[0], 2, 1)

        def forward(self, x):
            skips = []
            for down in self.downs:
                x = down(x)
                skips.append(x)
                x = F.max_pool2d(x, 2)
            x = self.ups[0](torch.cat([self.up_transposed(self.bottom(x)), skips[2]], 1))
            x = F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)
            x = self.ups[1](torch.cat([x, skips[1]], 1))
            x = F.interpolate(x, scale_factor=2.0, mode="nearest")
            return self.head(self.ups[2](torch.cat([x, skips[0]], 1)))

    return UNet()


def mlp(widths: tuple[int, ...]) -> Any:
    from torch import nn

    layers: list[nn.Module] = [nn.Linear(784, widths[0]), nn.GELU()]
    for cin, cout in zip(widths, widths[1:]):
        layers += [nn.LayerNorm(cin), nn.Linear(cin, cout), nn.ReLU()]
    return nn.Sequential(*layers[:-1], nn.Softmax(-1))


def lstm(hidden: int, layers: int) -> Any:
    from torch import nn

    class Tagger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(128, hidden, layers, batch_first=True)
            self.head = nn.Linear(hidden, 32)

        def forward(self, x):
            return self.head(self.lstm(x)[0])

    return Tagger()


def tiny_mobilenet(width: int) -> Any:
    """An inverted-residual block with depthwise conv and squeeze-excitation, as MobileNetV3's."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            wide = width * 4
            self.expand = nn.Sequential(
                nn.Conv2d(width, wide, 1, bias=False), nn.BatchNorm2d(wide), nn.Hardswish()
            )
            self.depthwise = _conv_bn(torch, wide, wide, groups=wide, act=nn.Hardswish())
            self.excite = nn.Sequential(
                nn.AdaptiveAvgPool2d(1),
                nn.Conv2d(wide, width, 1),
                nn.ReLU(),
                nn.Conv2d(width, wide, 1),
                nn.Hardsigmoid(),
            )
            self.project = nn.Sequential(nn.Conv2d(wide, width, 1, bias=False), nn.BatchNorm2d(width))

        def forward(self, x):
            y = self.depthwise(self.expand(x))
            return x + self.project(y * self.excite(y))

    stem = nn.Sequential(
        nn.Conv2d(3, width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU6()
    )
    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))
    return nn.Sequential(stem, Block(), Block(), head)


# --- export ----------------------------------------------------------------------------------


def export(model: ZooModel, exporter: str, path: Path) -> None:
    """Export ``model`` with ``exporter`` ("torchscript" or "dynamo") to ``path``, static
    shapes, weights inside the file. Written beside and renamed, so a failed export leaves
    nothing that a later run would take for a cached file."""
    import torch

    module = model.build()
    args = tuple(torch.from_numpy(a) for a in make_feeds(model.inputs).values())
    names = [spec.name for spec in model.inputs]
    partial = path.with_suffix(f".partial-{os.getpid()}")
    opset = TORCHSCRIPT_OPSET if exporter == "torchscript" else DYNAMO_OPSET
    kwargs: dict[str, Any] = {"dynamo": exporter == "dynamo", "opset_version": opset}
    if exporter == "dynamo":
        kwargs.update(external_data=False, verbose=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # Not under torch.no_grad(): there nn.MultiheadAttention takes its fused fast path, which
        # the TorchScript exporter cannot export (ViT's aten::_native_multi_head_attention).
        with warnings.catch_warnings(), _quiet():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module, args, str(partial), input_names=names, output_names=["output"], **kwargs
            )
        _strip_debug_info(partial)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Discard what the exporters print, from Python and from C++ alike (a failed TorchScript
    export dumps its whole graph); a failure still raises, with its message."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)


def _strip_debug_info(path: Path) -> None:
    """Drop the nodes' doc strings and metadata (the dynamo exporter's stack traces and FX
    nodes), which make a file two to three times its weights' size."""
    import onnx

    model = onnx.load(str(path))
    for node in model.graph.node:
        node.doc_string = ""
        del node.metadata_props[:]
    onnx.save(model, str(path))


def first_line(error: BaseException) -> str:
    """``Type: first line of the message`` (exporters' messages can run to a whole graph)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200] if text else ''}"


def export_all(jobs: list[tuple[str, str, str]]) -> dict[tuple[str, str], str]:
    """Export each ``(zoo model name, exporter, path)``; returns ``{(name, exporter): error}``
    for those that failed. Progress goes to stderr."""
    errors = {}
    for name, exporter, path in jobs:
        print(f"exporting {name} ({exporter})", file=sys.stderr, flush=True)
        try:
            export(ZOO[name], exporter, Path(path))
        except Exception as error:  # an exporter that cannot take a model is a fact to report
            errors[(name, exporter)] = first_line(error)
    return errors
