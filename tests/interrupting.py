"""Ctrl-C for a command-line child: start it, wait until it says it is running, interrupt it."""

import signal
import subprocess
import sys


def interrupt_when_running(child: str, argv: list[str], timeout: float) -> tuple[int, str]:
    """Run ``python -c child *argv``; once its first stdout line is "running", send SIGINT.
    Returns its exit code and stderr."""
    process = subprocess.Popen(
        [sys.executable, "-c", child, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A shell's background jobs start with SIGINT ignored; the child must take it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert process.stdout.readline() == "running\n"
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=timeout)
    finally:
        process.kill()
    return process.returncode, err
