"""The package's imports point down the layering table of the README ("## Layout"), and no
module is over 500 lines.

Every ``flowrt`` import counts: at module level, inside a function (a lazy import is still a
dependency) and under ``if TYPE_CHECKING:``. A room may import its own modules and the rooms
its row names; ``ALLOWED`` lists the few exceptions, each with the reason it stays for now.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "flowrt"
MAX_LINES = 500

# (importing module, imported module): why it is not fixed yet.
ALLOWED: dict[tuple[str, str], str] = {}

# Folders that hold rooms but are none themselves: their __init__ imports nothing of flowrt.
PACKAGE_MARKERS = {"flowrt/engine/__init__.py", "flowrt/workers/__init__.py"}


def _layout_table() -> list[tuple[str, list[str], str]]:
    """(room, paths, may-import cell) for each row of the README's layout table, top first."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 4 or cells[0] in ("room", "---"):
            continue
        room = cells[0].strip("`")
        paths = [p if p.startswith("flowrt/") else f"flowrt/{p}" for p in re.findall(r"`([^`]+)`", cells[1])]
        rows.append((room, paths, cells[3]))
    return rows


def _permissions() -> tuple[dict[str, str], dict[str, set[str]]]:
    """Which room each table path belongs to, and the rooms each room may import."""
    rows = _layout_table()
    names = [room for room, _, _ in rows]
    room_of_path = {path: room for room, paths, _ in rows for path in paths}
    may: dict[str, set[str]] = {}
    for i, (room, _, cell) in enumerate(rows):
        if cell == "everything below":
            may[room] = set(names[i + 1 :])
        else:
            may[room] = {name.strip("`") for name in re.findall(r"`[^`]+`", cell)}
        may[room].add(room)
    return room_of_path, may


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _room(path: Path, room_of_path: dict[str, str]) -> str | None:
    """The room of the longest table path that holds ``path``."""
    rel = path.relative_to(ROOT).as_posix()
    holders = [p for p in room_of_path if rel == p or (p.endswith("/") and rel.startswith(p))]
    return room_of_path[max(holders, key=len)] if holders else None


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The flowrt modules ``name`` imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import sub`` imports the submodule when there is one, else a name of pkg.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target.split(".")[0] == "flowrt" and target != name:
                found.add(target)
    return found


def _violations() -> list[str]:
    room_of_path, may = _permissions()
    modules = _modules()
    problems = []
    for name, path in modules.items():
        room = _room(path, room_of_path)
        for target in sorted(_imports(name, path, modules)):
            target_room = _room(modules[target], room_of_path)
            if room is not None and target_room in may[room]:
                continue
            if (name, target) not in ALLOWED:
                problems.append(f"{name} -> {target} (room {room} may not import room {target_room})")
    return problems


def test_the_table_names_rooms_and_each_may_import_only_rooms_below_it():
    rows = _layout_table()
    names = [room for room, _, _ in rows]
    assert len(rows) >= 10 and len(set(names)) == len(names), names
    _, may = _permissions()
    upward = [f"{room} -> {other}" for i, room in enumerate(names) for other in may[room] - set(names[i:])]
    assert not upward, f"rows that may import a room above them or not in the table: {upward}"


def test_every_module_belongs_to_a_room():
    room_of_path, _ = _permissions()
    modules = _modules()
    missing = [p for p in room_of_path if not (ROOT / p).exists()]
    assert not missing, f"table paths that do not exist: {missing}"
    homeless = []
    for name, path in modules.items():
        rel = path.relative_to(ROOT).as_posix()
        if rel in PACKAGE_MARKERS:
            assert not _imports(name, path, modules), f"{rel} holds rooms and should import nothing"
        elif _room(path, room_of_path) is None:
            homeless.append(rel)
    assert not homeless, f"modules in no room of the README's layout table: {homeless}"


def test_no_import_points_up_the_layering():
    problems = _violations()
    assert not problems, "imports against the README's layout table:\n" + "\n".join(problems)


def test_every_allowed_exception_still_exists():
    """An exception that was fixed leaves the list, so that it cannot come back unnoticed."""
    modules = _modules()
    stale = [pair for pair in ALLOWED if pair[1] not in _imports(pair[0], modules[pair[0]], modules)]
    assert not stale, f"remove these from ALLOWED, they no longer happen: {stale}"


def test_no_module_is_over_500_lines():
    long = {
        path.relative_to(ROOT).as_posix(): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"
