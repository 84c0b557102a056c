"""The backend registry: backend id -> factory, the only way the engine finds a backend,
and which backends make the default list (:class:`DefaultRank`)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import attrs

from flowrt.errors import BackendError
from flowrt.registry.protocols import Backend
from flowrt.validate import check_instance

BackendFactory = Callable[[], Backend]


def _always() -> bool:
    return True


@attrs.frozen
class DefaultRank:
    """A backend's place in the default backend list: what ``flowrt.optimize``,
    ``InferenceSession`` and the command line take when given no backends
    (``flowrt.defaults.default_backends()``).

    ``rank``: lower comes first; the built-in backends hold GpuAcc 10, CpuAcc 20, CpuRef 30
    (the reference, which takes every layer, last), so a backend to try before CpuRef takes
    25. ``runs_here``: whether the backend runs by default on this machine, asked each time a
    default list is built, so an answer that costs (GpuAcc's OpenCL probe) is the backend's
    to keep. A backend registered without one is used only when named.
    """

    rank: int = attrs.field(validator=attrs.validators.instance_of(int))
    runs_here: Callable[[], bool] = attrs.field(default=_always, validator=attrs.validators.is_callable())


class BackendId(str):
    """The id of a backend, e.g. ``BackendId("CpuRef")``; compares equal to the plain string."""

    __slots__ = ()


class BackendRegistry:
    """Maps backend ids to factories; makes a fresh backend object each time one is asked for.

    The registry never keeps backend instances: backends are stateless factory objects.
    """

    def __init__(self) -> None:
        self._factories: dict[BackendId, BackendFactory] = {}
        self._default_ranks: dict[BackendId, DefaultRank] = {}
        self._lock = threading.Lock()

    def register(
        self, backend_id: str, factory: BackendFactory, default_rank: DefaultRank | None = None
    ) -> None:
        """Register ``factory`` under ``backend_id``; BackendError if the id is taken.
        ``default_rank``, when given, puts the backend in the default list (see DefaultRank)."""
        check_instance(
            "default_rank",
            default_rank,
            (DefaultRank, type(None)),
            "a DefaultRank or None",
            where="BackendRegistry.register",
        )
        bid = BackendId(backend_id)
        with self._lock:
            if bid in self._factories:
                raise BackendError(f"backend {bid!r} is already registered")
            self._factories[bid] = factory
            if default_rank is not None:
                self._default_ranks[bid] = default_rank

    def unregister(self, backend_id: str) -> None:
        with self._lock:
            if backend_id not in self._factories:
                raise BackendError(f"backend {backend_id!r} is not registered")
            del self._factories[BackendId(backend_id)]
            self._default_ranks.pop(BackendId(backend_id), None)

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

    def default_ids(self) -> list[BackendId]:
        """The default backend list: each id registered with a DefaultRank whose ``runs_here()``
        answers True, lowest rank first (equal ranks in registration order). BackendError
        naming the backend where one of those answers raises."""
        with self._lock:  # the answers are asked outside it: a probe may be slow
            ranked = sorted(self._default_ranks.items(), key=lambda item: item[1].rank)
        return [bid for bid, rank in ranked if _runs_here(bid, rank)]

    def runs_by_default(self, backend_id: str) -> bool:
        """Whether ``backend_id`` is in the default list here: registered with a DefaultRank
        whose ``runs_here()`` answers True."""
        rank = self._default_ranks.get(BackendId(backend_id))
        return rank is not None and _runs_here(BackendId(backend_id), rank)

    def copy(self) -> BackendRegistry:
        new = BackendRegistry()
        with self._lock:
            new._factories = dict(self._factories)
            new._default_ranks = dict(self._default_ranks)
        return new


def _runs_here(backend_id: BackendId, rank: DefaultRank) -> bool:
    """The backend's ``runs_here()`` answer; a raising one is an error that names the backend."""
    try:
        return bool(rank.runs_here())
    except Exception as e:
        raise BackendError(
            f"backend {backend_id!r} failed to say whether it runs by default: {type(e).__name__}: {e}"
        ) from e


_default = BackendRegistry()


def backend_registry() -> BackendRegistry:
    """The process-wide default registry (CpuRef is registered in it when flowrt is imported)."""
    return _default
