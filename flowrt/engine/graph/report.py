"""The text report of an optimized network, as ``flowrt inspect`` prints it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flowrt.engine.graph.optimizer import OptimizedNetwork


def _section(title: str, items: list[str]) -> list[str]:
    return [f"{title} ({len(items)}):", *(f"  {item}" for item in items)] if items else [f"{title}: none"]


def _decisions(opt: OptimizedNetwork) -> list[str]:
    """Substitutions, fallbacks, copies and imports: where the backends changed the graph
    and where data moves between them."""
    first = opt.backends[0]
    hints = opt.options.hints
    fallbacks = [
        f"{name!r} ({opt.graph.layers[name].kind}) -> {d.backend}: "
        + (
            "placed by layer_backend_hints"
            if name in hints
            else "; ".join(f"{bid}: {reason}" for bid, reason in d.declined.items() if bid != d.backend)
        )
        for name, d in opt.fallbacks().items()
    ]
    return [
        *_section("substitutions", [s.describe() for s in opt.substitutions]),
        *_section(f"fallbacks from {first}", fallbacks),
        *_section("copies", [c.describe() for c in opt.copies()]),
        *_section("imports", [c.describe() for c in opt.imports()]),
    ]


def format_report(opt: OptimizedNetwork) -> str:
    lines = [f"backends (preference order): {', '.join(opt.backends)}"]
    counts = opt.backend_counts()
    lines.append("layers per backend: " + ", ".join(f"{b}={n}" for b, n in counts.items()))
    if opt.passes:
        lines.append("graph passes:")
        lines += [f"  {change}" for change in opt.passes]
    lines += _decisions(opt)
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
