"""The ``flowrt`` command line: run, inspect, convert, bench, tune, backends.

One module per command (``run.py``, ``inspect.py``, ...), the parser in ``parser.py``, and
what the commands share: checking paths and options before any work (``checks.py``), opening
a model file for a backend list (``model.py``), ``-v`` (``logs.py``). :func:`main` is the
console script; it imports the rest itself, so that a Ctrl-C while they import is still
one line and exit status 130.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

# Exit statuses: a flowrt error (bad option, bad model...), and Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``flowrt`` command line on ``argv`` (default: ``sys.argv[1:]``); the exit status.

    A flowrt error is one line on stderr and status 2; Ctrl-C is ``flowrt: interrupted`` and
    status 130; argparse's own usage errors exit 2 as argparse does (SystemExit).
    """
    try:
        from flowrt.cli.app import dispatch
        from flowrt.errors import FlowrtError

        try:
            return dispatch(argv)
        except FlowrtError as e:
            print(f"flowrt: error: {type(e).__name__}: {e}", file=sys.stderr)
            return EXIT_ERROR
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        return _interrupted()
    except BaseExceptionGroup as group:  # Ctrl-C that reached a trio nursery comes out wrapped
        if group.subgroup(KeyboardInterrupt) is None:
            raise
        return _interrupted()


def _interrupted() -> int:
    """Ctrl-C: one line, and the shell's exit status for SIGINT (128 + 2), not a traceback."""
    print("flowrt: interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED


__all__ = ["main"]
