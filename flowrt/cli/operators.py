"""The layer kinds each built-in backend has a kernel for, and what each kernel declines: the
page ``docs/operators.md`` holds and ``flowrt backends --ops`` prints.

The table is read from the backends' own kernel registries, never written by hand: a row per
layer kind the ONNX front end imports (``flowrt.engine.graph.layer_kind``, one kind per ONNX
operator), a column per backend (``load_all()`` of CpuRef's, CpuAcc's and GpuAcc's kernel
packages; GpuAcc's imports without an OpenCL device), and under it the reasons each CpuAcc and
GpuAcc kernel gives when it declines a layer, as written in its ``supports()`` (or a helper it
calls), so the page says "float32 only" where the kernel does.

    python scripts/operator_table.py            # (re)write docs/operators.md
    python scripts/operator_table.py --check    # exit 1 when docs/operators.md is stale
    flowrt backends --ops                       # print it

Output is sorted and has no dates or paths, so it changes only when a registry does.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
from collections.abc import Sequence
from typing import Any

REGENERATE = "python scripts/operator_table.py"

# (backend id, its kernel package, its layer-support module): the registries the table reads.
BACKENDS = (
    ("CpuRef", "flowrt.workers.cpu.ref.kernels", "flowrt.workers.cpu.ref.layer_support"),
    ("CpuAcc", "flowrt.workers.cpu.acc.kernels", "flowrt.workers.cpu.acc.layer_support"),
    ("GpuAcc", "flowrt.workers.gpu.kernels", "flowrt.workers.gpu.layer_support"),
)
# Kinds that are the graph's plumbing, not operators.
PLUMBING = {"Input", "Output"}
# Kinds that are flowrt's own, not ONNX operators: made by the optimizer, never imported.
FLOWRT_KINDS = {
    "MatMulBias": "flowrt's own: MatMul + bias Add, made by substitution",
    "ApplyRotary": "flowrt's own: a rotary embedding as exported (x * cos + rotate_half(x) * sin), made by substitution",
    "AttentionSoftmax": "flowrt's own: Softmax of scaled scores plus a mask, made by substitution",
    "TransposedMatMul": "flowrt's own: MatMul of transposed operands, its result transposed, made by substitution",
    "FusedConv": "flowrt's own: Conv + residual Add, as ONNX Runtime's com.microsoft FusedConv with Z; made by substitution",
}
CHECK = "✓"
# The end of a message that reports what was found: ", got shape (1, 2)".
FOUND_CLAUSE = re.compile(r"[,;]?\s*\b(got|found)\b[\w ]*$")


def kernel_tables() -> dict[str, dict[str, Any]]:
    """``{backend id: {layer kind: kernel}}`` from each backend's registry."""
    return {bid: importlib.import_module(package).load_all() for bid, package, _ in BACKENDS}


def layer_kinds() -> list[str]:
    """Every layer kind the ONNX front end and the Python builder know, sorted."""
    from flowrt.engine.graph.layer_kind import known_layer_kinds

    return sorted(k for k in known_layer_kinds() if k not in PLUMBING)


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _render(node: ast.expr, kind: str, names: dict[str, Any]) -> str | None:
    """A message literal as text: ``{info.kind}`` becomes the kind, a module constant its
    value; a value found at run time is cut when it ends the message (", got {shape}") and
    is an ellipsis elsewhere."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if not isinstance(node, ast.JoinedStr):
        return None
    text = ""
    for part in node.values:
        if isinstance(part, ast.Constant):
            text += str(part.value)
            continue
        expr = ast.unparse(part.value) if isinstance(part, ast.FormattedValue) else ""
        if expr in ("info.kind", "kind"):
            text += kind
        elif isinstance(names.get(expr), int | str):
            text += str(names[expr])
        elif FOUND_CLAUSE.search(text):
            return FOUND_CLAUSE.sub("", text)
        else:
            text += "…"
    return text


def _messages(fn: Any, kind: str, depth: int = 2) -> list[str]:
    """The ``Support.no(...)`` messages in ``fn``'s source and in the flowrt helpers it calls."""
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return []
    names = getattr(fn, "__globals__", {})
    found: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _callee(node)
        if name == "no" and node.args:
            text = _render(node.args[0], kind, names)
            found += [text] if text else []
        elif depth and inspect.isfunction(helper := names.get(name)):
            if helper.__module__.startswith("flowrt."):
                found += _messages(helper, kind, depth - 1)
    return found


def _tidy(message: str, backend: str, kinds: frozenset[str]) -> str:
    """A reason without the "CpuAcc Conv " its message opens with, and with no trailing stop."""
    words = message.split(" ")
    if words[0] in (backend, f"{backend}'s"):
        words = words[1:]
        if words and words[0] in kinds:
            words = words[1:]
    return " ".join(words).strip().rstrip(".")


def decline_reasons(backend: str, kind: str, kernel: Any, kinds: frozenset[str]) -> list[str]:
    """What ``kernel``'s ``supports()`` may decline, deduplicated, in a fixed order."""
    supports = next((vars(c)["supports"] for c in kernel.__mro__ if "supports" in vars(c)), None)
    if supports is None:
        return []
    reasons = [_tidy(m, backend, kinds) for m in _messages(supports, kind)]
    return list(dict.fromkeys(r for r in reasons if r))


def _rule(layer_support_module: str) -> str:
    """The first paragraph of a backend's layer-support module docstring: what it runs."""
    doc = inspect.getdoc(importlib.import_module(layer_support_module)) or ""
    return " ".join(doc.split("\n\n")[0].split())


def _table(kinds: Sequence[str], tables: dict[str, dict[str, Any]]) -> list[str]:
    ids = [bid for bid, _, _ in BACKENDS]
    lines = [f"| operator | {' | '.join(ids)} |", f"| --- | {' | '.join(':---:' for _ in ids)} |"]
    for kind in kinds:
        marks = " | ".join(CHECK if kind in tables[bid] else " " for bid in ids)
        note = f" ({FLOWRT_KINDS[kind]})" if kind in FLOWRT_KINDS else ""
        lines.append(f"| {kind}{note} | {marks} |")
    return lines


def _limits(kinds: Sequence[str], tables: dict[str, dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    known = frozenset(kinds)
    for bid, _, _ in BACKENDS[1:]:  # CpuRef takes every layer it has a kernel for
        lines += ["", f"### {bid}", ""]
        for kind in kinds:
            if kind in tables[bid]:
                reasons = decline_reasons(bid, kind, tables[bid][kind], known)
                lines += [f"- **{kind}**: {'; '.join(reasons)}"] if reasons else []
    return lines


def render() -> str:
    """The whole of docs/operators.md."""
    tables = kernel_tables()
    kinds = layer_kinds()
    counts = ", ".join(f"{bid} {sum(k in tables[bid] for k in kinds)}" for bid, _, _ in BACKENDS)
    rules = [f"- **{bid}**: {_rule(module)}" for bid, _, module in BACKENDS]
    lines = [
        "# Operators per backend",
        "",
        f"<!-- Generated by `{REGENERATE}` from the kernel registries; do not edit. -->",
        "",
        "Each layer kind is named after the ONNX operator it runs. A ✓ means the backend has a",
        "kernel for the kind; a layer a backend lacks, or declines (see the limits below), goes",
        "to the next backend of your preference list, and `flowrt inspect` says why. With the",
        "default list, `CpuAcc,CpuRef`, a blank under CpuAcc means the layer runs on CpuRef.",
        "Some layers never reach a backend: constant subgraphs are folded, Identity and",
        "inference-mode Dropout are removed, and activations are fused into the layer before",
        "them where that backend can apply them.",
        "",
        f"Kinds with a kernel, of {len(kinds)}: {counts}.",
        "",
        *rules,
        "",
        *_table(kinds, tables),
        "",
        "## Limits",
        "",
        "What a kernel declines even though the backend has one for the kind, as its `supports()`",
        "says (the layer then goes to the next backend). Values found only at run time, such as",
        "a shape, are left out.",
        *_limits(kinds, tables),
    ]
    return "\n".join(lines) + "\n"
