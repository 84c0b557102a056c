"""ONNX Runtime's log severities (0 verbose … 4 fatal) on flowrt's ``logging`` loggers."""

from __future__ import annotations

import logging

from flowrt.validate import check_int

# ONNX Runtime's OrtLoggingLevel -> Python's logging level.
LEVELS = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR, 4: logging.CRITICAL}


def set_default_logger_severity(severity: int) -> None:
    """Set the level of the ``flowrt`` logger (every flowrt module logs under it), as ONNX
    Runtime's function of that name sets its default logger's: 0 verbose, 1 info, 2 warning,
    3 error, 4 fatal. Process-wide, as ONNX Runtime's is."""
    severity = check_int("severity", severity, minimum=0, maximum=4, where="set_default_logger_severity")
    logging.getLogger("flowrt").setLevel(LEVELS[severity])
