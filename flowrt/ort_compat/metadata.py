"""ONNX Runtime's ``ModelMetadata``: what an ONNX model says about itself."""

from __future__ import annotations

import os
from typing import Any

import attrs

# ONNX Runtime's version for a model that sets none (INT64_MAX).
NO_VERSION = 2**63 - 1


@attrs.frozen
class ModelMetadata:
    """``InferenceSession.get_modelmeta()``: empty strings (and ``NO_VERSION``) for what the
    model does not say, and for models that are not ONNX (a Network, a .flowrt file)."""

    producer_name: str = ""
    graph_name: str = ""
    domain: str = ""
    description: str = ""
    graph_description: str = ""
    version: int = NO_VERSION
    custom_metadata_map: dict[str, str] = attrs.field(factory=dict)


def from_model(model: Any) -> ModelMetadata:
    """The metadata of an ``onnx.ModelProto``."""
    return ModelMetadata(
        producer_name=model.producer_name,
        graph_name=model.graph.name,
        domain=model.domain,
        description=model.doc_string,
        graph_description=model.graph.doc_string,
        version=model.model_version if model.HasField("model_version") else NO_VERSION,
        custom_metadata_map={p.key: p.value for p in model.metadata_props},
    )


def read(source: Any) -> ModelMetadata:
    """The metadata of a model file (its weights are not read) or of ONNX bytes."""
    import onnx

    if isinstance(source, str | os.PathLike):
        return from_model(onnx.load(source, load_external_data=False))
    model = onnx.ModelProto()
    model.ParseFromString(source)
    return from_model(model)
