"""Backends: their protocols, the registry that finds them, and what their optimizers answer."""

from flowrt.registry.backend_registry import BackendId, BackendRegistry, DefaultRank, backend_registry
from flowrt.registry.optimization_views import OptimizationViews, ReplacementLayer, Substitution
from flowrt.registry.protocols import (
    Backend,
    FusedActivation,
    LayerSupport,
    Support,
    Workload,
    WorkloadFactory,
    WorkloadInfo,
)

# The Backend API version third-party backends are checked against (major, minor).
BACKEND_API_VERSION = (1, 0)

__all__ = [
    "BACKEND_API_VERSION",
    "Backend",
    "BackendId",
    "BackendRegistry",
    "DefaultRank",
    "FusedActivation",
    "LayerSupport",
    "OptimizationViews",
    "ReplacementLayer",
    "Substitution",
    "Support",
    "Workload",
    "WorkloadFactory",
    "WorkloadInfo",
    "backend_registry",
]
