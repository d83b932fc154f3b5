"""The in-memory store's guard: one lock, and an outage a test can switch on."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from sendqueue.domain.errors import StoreUnavailable

__all__ = ["Guarded", "guarded"]

_F = TypeVar("_F", bound=Callable[..., Any])


class Guarded(Protocol):
    """What :func:`guarded` needs of the object: its lock and whether it is available."""

    _lock: threading.RLock
    _available: bool


def guarded(method: _F) -> _F:
    """Run ``method`` under the store's lock, failing while the store is made unavailable."""

    def wrapper(self: Guarded, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if not self._available:
                raise StoreUnavailable("in-memory task store made unavailable by the test")
            return method(self, *args, **kwargs)

    wrapper.__name__ = method.__name__
    wrapper.__qualname__ = method.__qualname__
    wrapper.__doc__ = method.__doc__
    return wrapper  # type: ignore[return-value]
