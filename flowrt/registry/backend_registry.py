"""The backend registry: backend id -> factory, the only way the engine finds a backend."""

from __future__ import annotations

import threading
from collections.abc import Callable

from flowrt.errors import BackendError
from flowrt.registry.protocols import Backend

BackendFactory = Callable[[], Backend]


class BackendId(str):
    """The id of a backend, e.g. ``BackendId("CpuRef")``; compares equal to the plain string."""

    __slots__ = ()


class BackendRegistry:
    """Maps backend ids to factories; makes a fresh backend object each time one is asked for.

    The registry never keeps backend instances: backends are stateless factory objects.
    """

    def __init__(self) -> None:
        self._factories: dict[BackendId, BackendFactory] = {}
        self._lock = threading.Lock()

    def register(self, backend_id: str, factory: BackendFactory) -> None:
        """Register ``factory`` under ``backend_id``; BackendError if the id is taken."""
        bid = BackendId(backend_id)
        with self._lock:
            if bid in self._factories:
                raise BackendError(f"backend {bid!r} is already registered")
            self._factories[bid] = factory

    def unregister(self, backend_id: str) -> None:
        with self._lock:
            if backend_id not in self._factories:
                raise BackendError(f"backend {backend_id!r} is not registered")
            del self._factories[BackendId(backend_id)]

    def is_registered(self, backend_id: str) -> bool:
        return backend_id in self._factories

    def ids(self) -> list[BackendId]:
        """Registered ids in registration order."""
        return list(self._factories)

    def get(self, backend_id: str) -> Backend:
        """A backend object made by the factory registered under ``backend_id``."""
        try:
            factory = self._factories[BackendId(backend_id)]
        except KeyError:
            known = ", ".join(self._factories) or "none"
            raise BackendError(f"backend {backend_id!r} is not registered (registered: {known})") from None
        try:
            return factory()
        except Exception as e:
            raise BackendError(f"backend {backend_id!r} failed to create: {type(e).__name__}: {e}") from e

    def copy(self) -> BackendRegistry:
        new = BackendRegistry()
        new._factories = dict(self._factories)
        return new


_default = BackendRegistry()


def backend_registry() -> BackendRegistry:
    """The process-wide default registry (CpuRef is registered in it when flowrt is imported)."""
    return _default
