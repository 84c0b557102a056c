"""What a backend answers when handed a subgraph to optimize (Arm NN's OptimizationViews)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from flowrt.registry.protocols import FusedActivation


def _slots(inputs: Iterable[Any]) -> tuple[Any, ...]:
    # A named converter: attrs' mypy plugin cannot type a field converted by ``tuple`` itself.
    return tuple(inputs)


@attrs.frozen
class ReplacementLayer:
    """The layer a backend puts in place of a subgraph: its own fused layer.

    ``kind`` and ``descriptor`` are a registered layer kind and its descriptor; ``inputs`` are
    the output slots it reads, in slot order (None for an absent optional input) — each one
    produced outside the replaced subgraph. Its outputs take the place of the subgraph's
    ``output_slots``, in order, and must have the same shapes and data types.
    ``activation`` is applied by its workload as it writes its output; ``name`` defaults to
    the name of the first replaced layer.
    """

    kind: str
    descriptor: Any
    inputs: tuple[Any, ...] = attrs.field(converter=_slots)
    activation: FusedActivation | None = None
    name: str | None = None


@attrs.define
class Substitution:
    """Replace the layers of ``subgraph`` (any iterable of layers) by ``replacement``."""

    subgraph: Any
    replacement: ReplacementLayer


@attrs.define
class OptimizationViews:
    """A backend's answer for one subgraph.

    Every layer of the subgraph it was handed ends up in exactly one list: substituted,
    failed (re-assigned to the next backend in the preference list) or untouched.
    """

    substitutions: list[Substitution] = attrs.Factory(list)
    failed: list[Any] = attrs.Factory(list)
    untouched: list[Any] = attrs.Factory(list)

    def add_substitution(self, subgraph: Any, replacement: ReplacementLayer) -> None:
        self.substitutions.append(Substitution(subgraph, replacement))

    def add_failed(self, subgraph: Any) -> None:
        self.failed.append(subgraph)

    def add_untouched(self, subgraph: Any) -> None:
        self.untouched.append(subgraph)
