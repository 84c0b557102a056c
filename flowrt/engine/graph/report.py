"""The text report of an optimized network, as ``flowrt inspect`` prints it.

:func:`format_summary` is what ``flowrt inspect`` prints first: the layers per backend, the
fallbacks grouped by reason, the copies between memories, and how many passes, substitutions
and imports there were. :func:`format_details` lists those and every layer (``inspect
--layers``); :func:`format_report` (``OptimizedNetwork.report()``) is the whole report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flowrt.engine.graph.optimizer import OptimizedNetwork

# Layer names shown for a group of fallbacks that share a reason; the rest are counted.
_NAMES_SHOWN = 3


def _section(title: str, items: list[str]) -> list[str]:
    return [f"{title} ({len(items)}):", *(f"  {item}" for item in items)] if items else [f"{title}: none"]


def _fallback_reason(opt: OptimizedNetwork, name: str) -> str:
    decision = opt.decisions[name]
    if name in opt.options.hints:
        return "placed by layer_backend_hints"
    return "; ".join(
        f"{bid}: {reason}" for bid, reason in decision.declined.items() if bid != decision.backend
    )


def _fallbacks(opt: OptimizedNetwork) -> list[str]:
    """One line per layer not on the first backend: where it went and why."""
    return [
        f"{name!r} ({opt.graph.layers[name].kind}) -> {d.backend}: {_fallback_reason(opt, name)}"
        for name, d in opt.fallbacks().items()
    ]


def _grouped_fallbacks(opt: OptimizedNetwork) -> list[str]:
    """The fallbacks, one line per (kind, backend, reason): a model's hundred Softmaxes that
    CpuAcc declined for one reason are one line, not a hundred."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for name, d in opt.fallbacks().items():
        key = (opt.graph.layers[name].kind, d.backend, _fallback_reason(opt, name))
        groups.setdefault(key, []).append(name)
    lines = []
    for (kind, backend, reason), names in groups.items():
        shown = ", ".join(repr(n) for n in names[:_NAMES_SHOWN])
        more = f" and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else ""
        what = f"({kind})" if len(names) == 1 else f"({len(names)} x {kind})"
        lines.append(f"{shown}{more} {what} -> {backend}: {reason}")
    return lines


def _header(opt: OptimizedNetwork) -> list[str]:
    counts = opt.backend_counts()
    cached = [f"read from the cache of optimized networks: {opt.cached_from}"] if opt.cached_from else []
    return [
        *cached,
        f"backends (preference order): {', '.join(opt.backends)}",
        "layers per backend: " + ", ".join(f"{b}={n}" for b, n in counts.items()),
        *(
            ["fast math: on (backends may take faster, less exact algorithms)"]
            if opt.options.fast_math
            else []
        ),
    ]


def _passes(opt: OptimizedNetwork) -> list[str]:
    return ["graph passes:", *(f"  {change}" for change in opt.passes)] if opt.passes else []


def _inputs_outputs(opt: OptimizedNetwork) -> list[str]:
    graph = opt.graph
    return [
        "inputs:",
        *(f"  {layer.descriptor.name}: {layer.descriptor.info}" for layer in graph.input_layers),
        "outputs:",
        *(f"  {layer.descriptor.name}: {layer.input_infos[0]}" for layer in graph.output_layers),
    ]


def _layer_table(opt: OptimizedNetwork) -> list[str]:
    """Every compute layer: name, type, output shape, backend, and why earlier backends declined it."""
    rows = []
    for layer in opt.graph.topological_order():
        if layer.backend is None:
            continue
        shapes = " ".join(str(o.info) for o in layer.outputs)
        rows.append((layer.name, layer.kind, shapes, layer.backend, opt.decisions[layer.name].declined))
    width = [
        max([len(header), *(len(r[i]) for r in rows)]) for i, header in enumerate(("name", "type", "output"))
    ]
    lines = [f"layers ({len(rows)}):"]
    lines.append(f"  {'name':<{width[0]}}  {'type':<{width[1]}}  {'output':<{width[2]}}  backend")
    for name, kind, shapes, backend, declined in rows:
        lines.append(f"  {name:<{width[0]}}  {kind:<{width[1]}}  {shapes:<{width[2]}}  {backend}")
        for bid, reason in declined.items():
            lines.append(f"  {'':<{width[0]}}    declined by {bid}: {reason}")
    return lines


def format_summary(opt: OptimizedNetwork) -> str:
    """What ``flowrt inspect`` prints first: the backends, layers per backend, fallbacks grouped
    by reason, copies, the count of everything :func:`format_details` lists, inputs and outputs."""
    fallbacks = _grouped_fallbacks(opt)
    count = len(opt.fallbacks())
    lines = [
        *_header(opt),
        *(
            [f"fallbacks from {opt.backends[0]} ({count} layer{'s' if count != 1 else ''}):"]
            + [f"  {line}" for line in fallbacks]
            if fallbacks
            else [f"fallbacks from {opt.backends[0]}: none"]
        ),
        *_section("copies", [c.describe() for c in opt.copies()]),
        f"imports (zero-copy): {len(opt.imports())}, substitutions: {len(opt.substitutions)}, "
        f"graph pass changes: {len(opt.passes)}",
        *_inputs_outputs(opt),
    ]
    return "\n".join(lines)


def format_details(opt: OptimizedNetwork) -> str:
    """The graph passes, substitutions, imports and the table of every layer (``inspect --layers``)."""
    lines = [
        *_passes(opt),
        *_section("substitutions", [s.describe() for s in opt.substitutions]),
        *_section("imports", [c.describe() for c in opt.imports()]),
        *_layer_table(opt),
    ]
    return "\n".join(lines)


def format_report(opt: OptimizedNetwork) -> str:
    """The whole report: backends, passes, substitutions, fallbacks, copies, imports, inputs,
    outputs and every layer."""
    lines = [
        *_header(opt),
        *_passes(opt),
        *_section("substitutions", [s.describe() for s in opt.substitutions]),
        *_section(f"fallbacks from {opt.backends[0]}", _fallbacks(opt)),
        *_section("copies", [c.describe() for c in opt.copies()]),
        *_section("imports", [c.describe() for c in opt.imports()]),
        *_inputs_outputs(opt),
        *_layer_table(opt),
    ]
    return "\n".join(lines)
