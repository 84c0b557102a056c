"""``flowrt.onnx``: the public ONNX entry points (``load``; ``flowrt.onnx.backend`` for conformance)."""

from flowrt.frontends.onnx import load

__all__ = ["load"]
