"""``-v``/``--verbose``: flowrt's log records on stderr (fallbacks, skipped backends, timings).

Without ``-v`` only warnings show (Python's last-resort handler prints them). ``-v`` shows
INFO, where the optimizer logs each fallback with its reason; ``-vv`` shows DEBUG. Records
are written through tqdm, so they print above a progress bar instead of through it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

_FORMAT = "flowrt: %(levelname)s: %(name)s: %(message)s"


class _AboveBars(logging.Handler):
    """Writes records to the current stderr, clearing and redrawing any tqdm bar around them."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # a handler never raises into the code that logged
            self.handleError(record)


@contextlib.contextmanager
def verbose_logging(verbosity: int) -> Iterator[None]:
    """Within the block, flowrt's loggers print at INFO (``verbosity`` 1) or DEBUG (2 and more)
    to stderr; 0 changes nothing. The logger is put back as it was afterwards."""
    if verbosity <= 0:
        yield
        return
    logger = logging.getLogger("flowrt")
    handler = _AboveBars()
    handler.setFormatter(logging.Formatter(_FORMAT))
    previous = logger.level
    logger.setLevel(logging.INFO if verbosity == 1 else logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
