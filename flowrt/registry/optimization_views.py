"""What a backend answers when handed a subgraph to optimize (Arm NN's OptimizationViews)."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.define
class Substitution:
    """Replace the layers of ``subgraph`` by those of ``replacement`` (a backend's fused layers)."""

    subgraph: Any
    replacement: Any


@attrs.define
class OptimizationViews:
    """A backend's answer for one subgraph.

    Every layer of the subgraph it was handed ends up in exactly one list: substituted,
    failed (re-assigned to the next backend in the preference list) or untouched.
    """

    substitutions: list[Substitution] = attrs.Factory(list)
    failed: list[Any] = attrs.Factory(list)
    untouched: list[Any] = attrs.Factory(list)

    def add_substitution(self, subgraph: Any, replacement: Any) -> None:
        self.substitutions.append(Substitution(subgraph, replacement))

    def add_failed(self, subgraph: Any) -> None:
        self.failed.append(subgraph)

    def add_untouched(self, subgraph: Any) -> None:
        self.untouched.append(subgraph)
