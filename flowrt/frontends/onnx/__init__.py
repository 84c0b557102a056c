"""The ONNX front end: ``load(path)`` -> Network."""

from flowrt.frontends.onnx.importer import load, read_model

__all__ = ["load", "read_model"]
