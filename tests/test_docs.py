"""The user guide stays true: the operator table matches the kernel registries, the conformance
page lists the cases the conformance suite excludes, every relative link leads somewhere, the CLI reference names every option, and (``-m slow``) every Python
example of docs/ runs.

Python examples: each page's ```python blocks run in order as one script, in a fresh
directory where the block marked ``<!-- docs-test: makes tiny.onnx -->`` (getting-started.md)
has run first. A block preceded by ``<!-- docs-test: skip ... -->`` is not run (it needs a GPU,
a file of yours, or a loop that never ends).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flowrt.cli.parser import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
SETUP_MARK = "<!-- docs-test: makes tiny.onnx -->"
SKIP_MARK = "<!-- docs-test: skip"

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
BLOCK = re.compile(r"(?P<mark><!-- docs-test:[^>]*-->\n)?```(?P<lang>\w*)\n(?P<code>.*?)^```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _operator_table_script():
    return _script("operator_table")


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    text = INLINE_CODE.sub(lambda m: m.group(0)[1:-1], heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {_slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def _links(path: Path) -> list[str]:
    text = INLINE_CODE.sub("", FENCE.sub("", path.read_text(encoding="utf-8")))
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


def test_operator_table_matches_the_kernel_registries(capsys):
    script = _operator_table_script()
    status = script.main(["--check"])
    assert status == 0, capsys.readouterr().err


def test_operator_table_check_names_the_stale_file_and_the_command(tmp_path, capsys):
    script = _operator_table_script()
    stale = tmp_path / "operators.md"
    stale.write_text("# Operators per backend\n\n| Conv | ✓ |\n", encoding="utf-8")
    assert script.main(["--check", "--output", str(stale)]) == 1
    err = capsys.readouterr().err
    assert f"{stale} is stale" in err
    assert "python scripts/operator_table.py" in err


def test_operator_table_marks_what_each_backend_registers():
    text = (DOCS / "operators.md").read_text(encoding="utf-8")
    assert "| Conv | ✓ | ✓ | ✓ |" in text
    assert "| ArgMax | ✓ |   |   |" in text  # CpuRef only
    assert "- **Conv**: takes float32 only" in text  # CpuAcc's reason, from its supports()


def test_conformance_page_lists_the_cases_the_suite_excludes(capsys):
    script = _script("conformance_report")
    status = script.main(["--check"])
    assert status == 0, capsys.readouterr().err


def test_the_conformance_script_runs_as_its_docs_say():
    # as a command, outside pytest (which puts the tests directory on sys.path)
    script = ROOT / "scripts" / "conformance_report.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_conformance_check_names_the_stale_file_and_the_command(tmp_path, capsys):
    script = _script("conformance_report")
    stale = tmp_path / "conformance.md"
    stale.write_text(f"# ONNX conformance\n\n{script.BEGIN}\nNone.\n{script.END}\n", encoding="utf-8")
    assert script.main(["--check", "--output", str(stale)]) == 1
    err = capsys.readouterr().err
    assert f"{stale} is stale" in err
    assert "python scripts/conformance_report.py" in err


@pytest.mark.parametrize("page", [*PAGES, ROOT / "README.md"], ids=lambda p: p.name)
def test_relative_links_lead_to_existing_files_and_headings(page):
    broken = []
    for target in _links(page):
        file_part, _, anchor = target.partition("#")
        resolved = (page.parent / file_part).resolve() if file_part else page
        if not resolved.exists():
            broken.append(f"{target} (no file {resolved})")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target} (no heading #{anchor} in {resolved.name})")
    assert not broken, f"{page.name}: broken links: {broken}"


def test_cli_reference_names_every_command_and_option():
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    missing = []
    for name, sub in commands.items():
        if f"## flowrt {name}" not in text:
            missing.append(f"section '## flowrt {name}'")
        for action in sub._actions:
            missing += [f"{name} {o}" for o in action.option_strings if f"`{o}" not in text]
    assert not missing, f"docs/cli.md lacks: {missing}"


def _examples(page: Path) -> tuple[list[str], str]:
    """The page's runnable Python blocks, and the setup block when the page has it."""
    runnable, setup = [], ""
    for block in BLOCK.finditer(page.read_text(encoding="utf-8")):
        mark = block.group("mark") or ""
        if block.group("lang") != "python" or mark.startswith(SKIP_MARK):
            continue
        if mark.startswith(SETUP_MARK):
            setup = block.group("code")
        else:
            runnable.append(block.group("code"))
    return runnable, setup


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_python_examples_run(page, tmp_path):
    blocks, _ = _examples(page)
    if not blocks:
        pytest.skip(f"{page.name} has no Python example")
    _, setup = _examples(DOCS / "getting-started.md")
    script = tmp_path / f"{page.stem}.py"
    script.write_text("\n\n".join([setup, *blocks]), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{page.name}'s examples failed:\n{done.stdout}\n{done.stderr}"
