"""Parse the command line, set up what every command shares (``-v``, progress bars), run the command."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from flowrt.cli.logs import verbose_logging
from flowrt.cli.parser import build_parser
from flowrt.progress import bars_wanted, load_progress

# Commands whose loads show Runtime.load's progress bar (``flowrt bench --json`` stays quiet).
_LOAD_PROGRESS = ("run", "inspect", "bench")


def dispatch(argv: Sequence[str] | None) -> int:
    """Run the command ``argv`` names (``flowrt.cli.<command>.command``); its exit status.
    Errors propagate to ``flowrt.cli.main``."""
    args = build_parser().parse_args(argv)
    # Bars on stderr where flowrt.progress wants them; --json output stays free of them.
    args.bars = bars_wanted() and not getattr(args, "json", False)
    token = load_progress.set(args.bars and args.command in _LOAD_PROGRESS)
    try:
        with verbose_logging(args.verbose):
            return importlib.import_module(args.module).command(args)
    finally:
        load_progress.reset(token)
