"""Write docs/conformance.md: how much of onnx's conformance suite flowrt passes.

Runs tests/frontends/onnx/test_backend_conformance.py, both its runs (CpuRef alone, and
CpuAcc then CpuRef), through pytest in this process, and writes per kind of case (node, real,
simple, pytorch-converted, pytorch-operator) and backend list the cases passed out of all the
cases of that kind onnx ships: an excluded case counts as not passing. Under it, every case
excluded (the suite's ``EXCLUDED`` and ``CPUACC_KNOWN_DIFFERENCES``, with their reasons) and
every case that failed, grouped by reason.

    python scripts/conformance_report.py            # run the suite, (re)write docs/conformance.md
    python scripts/conformance_report.py --check    # exit 1 when its exclusion lists are stale

Writing takes what the suite takes: about 2 minutes on 2 cores, a minute per run, with
numba's cache warm (the CpuAcc,CpuRef run took 2.3 minutes with it partly cold). ``--check`` runs
nothing: it compares the page's exclusion lists with the suite's, in seconds (most of them onnx
building its node cases). The page has no dates or paths; the onnx version is named.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType

import onnx
import pytest

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "tests" / "frontends" / "onnx" / "test_backend_conformance.py"
SUITE_HELPERS = ROOT / "tests"
DEFAULT_OUTPUT = ROOT / "docs" / "conformance.md"
REGENERATE = "python scripts/conformance_report.py"
RUNS = ("CpuRef", "CpuAcc,CpuRef")
BEGIN, END = "<!-- exclusions: begin -->", "<!-- exclusions: end -->"


def load_suite() -> ModuleType:
    """The conformance test module (its import computes ``EXCLUDED``). It imports helpers of
    the tests directory, which pytest puts on ``sys.path``, and so does this."""
    if str(SUITE_HELPERS) not in sys.path:
        sys.path.insert(0, str(SUITE_HELPERS))
    spec = importlib.util.spec_from_file_location("test_backend_conformance", SUITE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Recorder:
    """A pytest plugin that keeps, per case, its run and kind and how it ended."""

    def __init__(self) -> None:
        self.cases: dict[str, tuple[str, str, str]] = {}  # nodeid: (run, kind, test name)
        self.passed: set[str] = set()
        self.failed: dict[str, str] = {}  # nodeid: the error's first line

    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            if getattr(item, "cls", None) is not None and hasattr(item.cls, "backends"):
                run = ",".join(item.cls.backends)
                self.cases[item.nodeid] = (run, item.cls.kind, item.name)

    def pytest_runtest_logreport(self, report) -> None:
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else str(report.longrepr)
            self.failed.setdefault(report.nodeid, message.strip().splitlines()[0][:200])
        elif report.when == "call" and report.passed and report.nodeid in self.cases:
            self.passed.add(report.nodeid)


def run_suite() -> Recorder:
    """Both runs of the suite, every case recorded."""
    recorder = Recorder()
    args = [
        str(SUITE),
        "-q",
        "--tb=no",
        "-rf",
        "-m",
        "slow or not slow",
        "-W",
        "ignore",
        "-p",
        "no:cacheprovider",
    ]
    pytest.main(args, plugins=[recorder])
    return recorder


def _by_reason(cases: Iterable[tuple[str, str]], heading: str = "###") -> list[str]:
    """Markdown: one heading per reason (most cases first), its cases' names under it."""
    groups: dict[str, list[str]] = {}
    for name, reason in cases:
        groups.setdefault(reason, []).append(name)
    lines = []
    for reason, names in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
        cases_text = ", ".join(f"`{n}`" for n in sorted(names))
        lines += ["", f"{heading} {reason} ({len(names)})", "", cases_text]
    return lines or ["", "None."]


def _matched(patterns: Sequence[tuple[str, str]], names: list[str]) -> list[tuple[str, str]]:
    """(case name, reason) for each case a pattern excludes (the first pattern's reason)."""
    found = {}
    for pattern, reason in patterns:
        for name in names:
            if re.search(pattern, name):
                found.setdefault(name, reason)
    return sorted(found.items())


def render_exclusions(suite: ModuleType) -> str:
    """The page's exclusion lists, from the suite alone (what ``--check`` compares)."""
    names = [name for kind_names in suite.case_names().values() for name in kind_names]
    everywhere = _matched(suite.EXCLUDED, names)
    cpuacc = _matched(suite.CPUACC_KNOWN_DIFFERENCES, names)
    lines = [
        BEGIN,
        "## Cases excluded from both runs",
        "",
        f"{len(everywhere)} cases, `EXCLUDED` in the suite: those the models show flowrt cannot",
        "run (an operator it does not implement, a non-tensor type), and `KNOWN_DIFFERENCES`.",
        *_by_reason(everywhere),
        "",
        "## Cases excluded from the CpuAcc,CpuRef run",
        "",
        f"{len(cpuacc)} cases, `CPUACC_KNOWN_DIFFERENCES` in the suite: CpuRef passes them, CpuAcc",
        "does not (a CpuAcc bug, or its float32 rounding where a case is that sensitive).",
        *_by_reason(cpuacc),
        END,
    ]
    return "\n".join(lines)


def _rates(suite: ModuleType, recorder: Recorder) -> list[str]:
    totals = {kind: len(names) for kind, names in suite.case_names().items()}
    passed = {(run, kind): 0 for run in RUNS for kind in totals}
    for nodeid in recorder.passed:
        run, kind, _name = recorder.cases[nodeid]
        passed[run, kind] += 1
    rows = [(kind, totals[kind], [passed[run, kind] for run in RUNS]) for kind in totals]
    rows.append(("all", sum(totals.values()), [sum(p[i] for _k, _t, p in rows) for i in range(len(RUNS))]))
    lines = ["| kind | cases | " + " | ".join(RUNS) + " |", "| --- | ---: |" + " ---: |" * len(RUNS)]
    for kind, total, counts in rows:
        cells = " | ".join(f"{n} ({100 * n / total:.1f} %)" for n in counts)
        lines.append(f"| {kind} | {total} | {cells} |")
    return lines


def render(suite: ModuleType, recorder: Recorder) -> str:
    """The whole page, from the suite and its run."""
    failed = {run: [] for run in RUNS}
    for nodeid, message in recorder.failed.items():
        run, _kind, name = recorder.cases.get(nodeid, ("other tests of the suite", "", nodeid))
        failed.setdefault(run, []).append((name, message))
    lines = [
        "# ONNX conformance",
        "",
        f"<!-- Generated by `{REGENERATE}` from a run of the suite; do not edit. -->",
        "",
        f"How much of onnx's conformance suite (`onnx.backend.test`, onnx {onnx.__version__}) flowrt",
        "passes through its onnx backend (`flowrt.onnx.backend`), as",
        "`tests/frontends/onnx/test_backend_conformance.py` runs it: on CpuRef alone (CI's run), and",
        "on CpuAcc with CpuRef for the layers CpuAcc declines (`pytest -m slow`). The node cases are",
        "built by onnx's own generators, one or a few per operator; the other kinds are models the",
        "onnx package ships.",
        "",
        "## Pass rates",
        "",
        "Cases passed of all the cases of the kind: an excluded case counts as not passing.",
        "",
        *_rates(suite, recorder),
        "",
        render_exclusions(suite),
        "",
        "## Cases that failed",
        "",
        "In the run that wrote this page, beyond those excluded.",
    ]
    for run in failed:
        lines += ["", f"### On {run}", *_by_reason(failed[run], heading="####")]
    return "\n".join(lines) + "\n"


def check(path: Path, suite: ModuleType) -> int:
    """0 when ``path``'s exclusion lists are the suite's; else 1, with a message."""
    current = path.read_text(encoding="utf-8") if path.exists() else ""
    match = re.search(f"{re.escape(BEGIN)}.*?{re.escape(END)}", current, re.S)
    found = match.group(0) if match else ""
    expected = render_exclusions(suite)
    if found == expected:
        return 0
    diff = difflib.unified_diff(
        found.splitlines(), expected.splitlines(), str(path), "the suite", lineterm=""
    )
    print(
        f"{path} is stale: its excluded cases are not the conformance suite's (an operator was "
        f"added or an exclusion changed). Run `{REGENERATE}` and commit the result.\n"
        + "\n".join(list(diff)[:40]),
        file=sys.stderr,
    )
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite and write the page, or with ``--check`` compare; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the exclusions are stale; run nothing"
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="default: docs/conformance.md")
    args = parser.parse_args(argv)
    suite = load_suite()
    if args.check:
        return check(args.output, suite)
    text = render(suite, run_suite())
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
