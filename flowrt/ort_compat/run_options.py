"""ONNX Runtime's ``RunOptions``: a run's tag and its ``terminate`` flag, which cancels the runs
that use the options, from any thread.

The one place a session's run meets a foreign thread's flag: the run's cancel scope is
cancelled through its loop's token (``run_sync_soon`` is the thread-safe way into a trio loop
that is not the caller's), so a terminated run stops at its next workload, as a cancelled
``model.run`` does, and gives its memory back.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs
import trio

from flowrt.errors import ArgumentError, FlowrtError, RunError
from flowrt.validate import check_bool, check_instance, check_int

T = TypeVar("T")
_WHERE = "RunOptions"


class RunTerminatedError(RunError):
    """A run ended by ``RunOptions.terminate`` (ONNX Runtime's "Exiting due to terminate flag
    being set to true"); a RunError, so also a RuntimeError."""

    def __init__(self, logid: str) -> None:
        super().__init__(None, None, FlowrtError("RunOptions.terminate was set to True"))
        tag = f" {logid!r}" if logid else ""
        self.args = (
            f"run{tag} terminated: RunOptions.terminate was set to True (Exiting due to terminate flag)",
        )


def _severity(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    check_int(attribute.name, value, minimum=-1, maximum=4, where=_WHERE)


def _str(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    check_instance(attribute.name, value, str, "a str", where=_WHERE)


@attrs.define
class RunOptions:
    """Options of one ``run`` (ONNX Runtime's ``RunOptions``). Setting ``terminate = True``,
    from any thread, ends the runs in flight that use them with RunTerminatedError, and the
    runs started while it stays True at once. ``logid`` (also ``run_tag``) names the run in
    that error. ``log_severity_level``, ``log_verbosity_level``,
    ``only_execute_path_to_fetches`` and run config entries are accepted and ignored.
    """

    log_severity_level: int = attrs.field(default=-1, validator=_severity)
    log_verbosity_level: int = attrs.field(default=0, validator=_severity)
    logid: str = attrs.field(default="", validator=_str)
    only_execute_path_to_fetches: bool = attrs.field(
        default=False, validator=lambda i, a, v: check_bool(a.name, v, where=_WHERE)
    )
    config_entries: dict[str, str] = attrs.field(factory=dict, init=False)
    _terminate: bool = attrs.field(default=False, init=False, repr=False, eq=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False, eq=False)
    _watchers: dict[int, Callable[[], None]] = attrs.field(factory=dict, init=False, repr=False, eq=False)
    _ids: Any = attrs.field(factory=itertools.count, init=False, repr=False, eq=False)

    @property
    def terminate(self) -> bool:
        """Whether runs using these options are to end (see the class doc)."""
        return self._terminate

    @terminate.setter
    def terminate(self, value: bool) -> None:
        value = check_bool("terminate", value, where=_WHERE)
        with self._lock:
            self._terminate = value  # runs that start from now on see it
            watchers = list(self._watchers.values()) if value else []
        for cancel in watchers:
            cancel()

    @property
    def run_tag(self) -> str:
        """The run's tag: ``logid`` under the C API's name."""
        return self.logid

    @run_tag.setter
    def run_tag(self, value: str) -> None:
        self.logid = value

    def add_run_config_entry(self, config_key: str, config_value: str) -> None:
        """Set a run config entry (kept; flowrt reads none)."""
        check_instance("config_key", config_key, str, "a str", where=_WHERE)
        check_instance("config_value", config_value, str, "a str", where=_WHERE)
        self.config_entries[config_key] = config_value

    def get_run_config_entry(self, config_key: str) -> str:
        """A run config entry's value; ArgumentError naming the key when it was never set."""
        if config_key not in self.config_entries:
            raise ArgumentError(f"{_WHERE} does not have configuration with key: {config_key!r}")
        return self.config_entries[config_key]

    def _watch(self, cancel: Callable[[], None]) -> Callable[[], None]:
        """Call ``cancel`` when ``terminate`` is set (at once if it is); returns the unwatch."""
        with self._lock:
            key = next(self._ids)
            self._watchers[key] = cancel
            terminated = self._terminate
        if terminated:
            cancel()

        def unwatch() -> None:
            with self._lock:
                self._watchers.pop(key, None)

        return unwatch


async def run_terminable(run_options: RunOptions, async_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``await async_fn(*args)`` in a cancel scope that ``run_options.terminate`` cancels;
    RunTerminatedError when it does."""
    check_instance("run_options", run_options, RunOptions, "a flowrt.RunOptions or None", where="run")
    token = trio.lowlevel.current_trio_token()
    with trio.CancelScope() as scope:

        def cancel() -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(scope.cancel)

        unwatch = run_options._watch(cancel)
        try:
            return await async_fn(*args)
        finally:
            unwatch()
    raise RunTerminatedError(run_options.logid)
