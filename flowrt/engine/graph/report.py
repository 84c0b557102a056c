"""The text report of an optimized network, as ``flowrt inspect`` prints it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flowrt.engine.graph.optimizer import OptimizedNetwork


def format_report(opt: OptimizedNetwork) -> str:
    lines = [f"backends (preference order): {', '.join(opt.backends)}"]
    counts = opt.backend_counts()
    lines.append("layers per backend: " + ", ".join(f"{b}={n}" for b, n in counts.items()))
    if opt.passes:
        lines.append("graph passes:")
        lines += [f"  {change}" for change in opt.passes]
    graph = opt.graph
    lines.append("inputs:")
    for layer in graph.input_layers:
        lines.append(f"  {layer.descriptor.name}: {layer.descriptor.info}")
    lines.append("outputs:")
    for layer in graph.output_layers:
        lines.append(f"  {layer.descriptor.name}: {layer.input_infos[0]}")
    rows = []
    for layer in graph.topological_order():
        if layer.backend is None:
            continue
        shapes = " ".join(str(o.info) for o in layer.outputs)
        rows.append((layer.name, layer.kind, shapes, layer.backend, opt.decisions[layer.name].declined))
    width = [
        max([len(header), *(len(r[i]) for r in rows)]) for i, header in enumerate(("name", "type", "output"))
    ]
    lines.append(f"layers ({len(rows)}):")
    lines.append(f"  {'name':<{width[0]}}  {'type':<{width[1]}}  {'output':<{width[2]}}  backend")
    for name, kind, shapes, backend, declined in rows:
        lines.append(f"  {name:<{width[0]}}  {kind:<{width[1]}}  {shapes:<{width[2]}}  {backend}")
        for bid, reason in declined.items():
            lines.append(f"  {'':<{width[0]}}    declined by {bid}: {reason}")
    return "\n".join(lines)
