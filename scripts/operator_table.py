"""Write docs/operators.md: the layer kinds each built-in backend has a kernel for, as
``flowrt.cli.operators`` renders it from the kernel registries (``flowrt backends --ops``
prints the same page).

    python scripts/operator_table.py            # (re)write docs/operators.md
    python scripts/operator_table.py --check    # exit 1 when docs/operators.md is stale

Output is sorted and has no dates or paths, so it changes only when a registry does.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flowrt.cli.operators import REGENERATE, render

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = ROOT / "docs" / "operators.md"


def check(path: Path, text: str, out: Callable[[str], Any]) -> int:
    """0 when ``path`` holds ``text``; else 1, with a message and the first differing lines."""
    current = path.read_text(encoding="utf-8") if path.exists() else ""
    if current == text:
        return 0
    diff = difflib.unified_diff(
        current.splitlines(), text.splitlines(), str(path), "from the registries", lineterm="", n=1
    )
    shown = list(diff)[:40]
    out(
        f"{path} is stale: it does not match the kernel registries (a kernel was added, removed "
        f"or changed what it declines). Run `{REGENERATE}` and commit the result.\n" + "\n".join(shown)
    )
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Write the table, or with ``--check`` compare it; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale; write nothing")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="default: docs/operators.md")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        return check(args.output, text, lambda message: print(message, file=sys.stderr))
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
