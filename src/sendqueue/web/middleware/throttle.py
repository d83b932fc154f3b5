"""Back-off for token guessing, and a request rate for the public unsubscribe routes.

Token guessing: failed token checks (a wrong bearer token, a wrong token posted
to ``/login``) are counted per client address. From the ``max_failures``-th failure on, the
client is locked out for 1 s, then 2 s, 4 s, ... (at most ``max_lockout``): while locked, a
bearer request or a ``POST /login`` gets 429 with ``Retry-After`` and the token is not even
compared. A client's failures are forgotten ``window`` seconds after its last one, or at its
first success. Each failure is logged at WARNING with the client, the route and the count,
never the token.

:class:`RequestRate` bounds the requests one client address makes to the public one-click
unsubscribe routes (``/u/*``, open without a token): at most ``per_minute`` in any minute, as a
token bucket refilled continuously; beyond it, 429 with ``Retry-After``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from starlette.responses import Response

from sendqueue.web.errors import HttpProblem, error_response

__all__ = ["AuthThrottle", "RequestRate"]

log = logging.getLogger(__name__)

#: Client addresses remembered at once; the oldest is forgotten first beyond it.
_MAX_CLIENTS = 10_000


@dataclass
class _Record:
    failures: int
    last: float
    locked_until: float


class AuthThrottle:
    """Failed token checks per client address, and the lockout they earn."""

    def __init__(
        self,
        *,
        max_failures: int,
        window: float,
        max_lockout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_failures < 1 or not window > 0 or not max_lockout >= 1:
            raise ValueError("max_failures >= 1, window > 0 and max_lockout >= 1 are required")
        self.max_failures = max_failures
        self.window = window
        self.max_lockout = max_lockout
        self._clock = clock
        self._clients: OrderedDict[str, _Record] = OrderedDict()

    def _record(self, client: str, now: float) -> _Record | None:
        record = self._clients.get(client)
        if record is not None and now - record.last > self.window and now >= record.locked_until:
            del self._clients[client]
            return None
        return record

    def retry_after(self, client: str) -> float:
        """Seconds ``client`` is still locked out for; 0 when it may try."""
        now = self._clock()
        record = self._record(client, now)
        return max(record.locked_until - now, 0.0) if record is not None else 0.0

    def failed(self, client: str, where: str) -> None:
        """Count a failed token check of ``client`` at ``where`` (method and path)."""
        now = self._clock()
        record = self._record(client, now)
        if record is None:
            record = self._clients[client] = _Record(0, now, 0.0)
            if len(self._clients) > _MAX_CLIENTS:
                self._clients.popitem(last=False)
        self._clients.move_to_end(client)
        record.failures += 1
        record.last = now
        over = record.failures - self.max_failures
        lockout = 0.0
        if over >= 0:
            lockout = min(2.0 ** min(over, 32), self.max_lockout)
            record.locked_until = now + lockout
        log.warning(
            "failed login from %s at %s: wrong token (%d in a row%s)",
            client,
            where,
            record.failures,
            f"; locked out for {lockout:g} s" if lockout else "",
        )

    def succeeded(self, client: str) -> None:
        self._clients.pop(client, None)

    def refusal(self, seconds: float) -> Response:
        """The 429 for a client locked out for ``seconds`` more."""
        wait = max(math.ceil(seconds), 1)
        return error_response(
            429,
            f"too many wrong tokens from this address; try again in {wait} s",
            headers={"Retry-After": str(wait)},
        )


class RequestRate:
    """At most ``per_minute`` requests per client address in any minute (a token bucket of
    that size, refilled continuously); see the module docstring."""

    def __init__(self, per_minute: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if per_minute < 1:
            raise ValueError("per_minute >= 1 is required")
        self.per_minute = per_minute
        self._refill = per_minute / 60.0  # requests per second
        self._clock = clock
        self._lock = threading.Lock()
        # client -> (requests left, when counted)
        self._clients: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, client: str) -> float:
        """Count a request of ``client``: 0 when it may go on, else the seconds it must wait
        (the request is then not counted)."""
        now = self._clock()
        with self._lock:
            left, at = self._clients.pop(client, (float(self.per_minute), now))
            left = min(self.per_minute, left + (now - at) * self._refill)
            wait = 0.0 if left >= 1 else (1 - left) / self._refill
            self._clients[client] = (left - 1 if wait == 0 else left, now)
            if len(self._clients) > _MAX_CLIENTS:
                self._clients.popitem(last=False)  # the longest quiet: it has the most left
        return wait

    def check(self, client: str) -> None:
        """Count a request of ``client``; raise the 429 (an HttpProblem with ``Retry-After``)
        when it is past its rate."""
        seconds = self.take(client)
        if seconds <= 0:
            return
        wait = max(math.ceil(seconds), 1)
        raise HttpProblem(
            429,
            f"too many unsubscribe requests from this address (at most {self.per_minute} a "
            f"minute); try again in {wait} s",
            headers={"Retry-After": str(wait)},
        )
