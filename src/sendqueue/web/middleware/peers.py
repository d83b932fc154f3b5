"""The connections one client address may hold at once
(``SENDQUEUE_HTTP_MAX_CONNECTIONS_PER_CLIENT``).

uvicorn's ``limit_concurrency`` counts every connection of every client together, so one client
opening that many made the server answer 503 to everyone. :class:`PeerCap` counts them per peer
address; :class:`~sendqueue.web.middleware.limits.HeaderTimeoutProtocol` asks it as each
connection is made and answers 503 (then closes) beyond the cap. Trusted proxies
(``SENDQUEUE_FORWARDED_ALLOW_IPS``) are exempt: behind one, every client shares its address,
and the proxy is where a per-client cap belongs. Refusals are logged at INFO once per client
per :attr:`PeerCap.log_interval`, with how many there were, not once per connection.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from sendqueue.domain.wording import plural

__all__ = ["Networks", "PeerCap"]

log = logging.getLogger(__name__)

Networks = Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network] | None


class PeerCap:
    """Open connections per peer address, capped at ``limit``; ``exempt`` are never capped
    (None: every peer is exempt, the ``*`` of the forwarded setting)."""

    log_interval = 60.0

    def __init__(
        self, limit: int, exempt: Networks = (), clock: Callable[[], float] = time.monotonic
    ) -> None:
        if limit < 1:
            raise ValueError(f"the per-client connection cap must be at least 1, got {limit!r}")
        self.limit = limit
        self.exempt = exempt
        self._clock = clock
        self._open: dict[str, int] = {}
        # peer -> (when its refusals were last logged, refusals since)
        self._refused: dict[str, tuple[float, int]] = {}

    def _is_exempt(self, host: str) -> bool:
        if self.exempt is None:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False  # a Unix socket's peer: one local client
        return any(address in network for network in self.exempt)

    def admit(self, client: Any) -> str | None:
        """Count a new connection from ``client`` ((host, port) or None); the key to pass to
        :meth:`release` when it closes, or None when it is over the cap (not counted)."""
        host = str(client[0]) if client else ""
        if self._is_exempt(host):
            return ""
        held = self._open.get(host, 0)
        if held >= self.limit:
            self._note_refusal(host)
            return None
        self._open[host] = held + 1
        return host

    def release(self, key: str) -> None:
        if not key:
            return
        held = self._open.get(key, 0) - 1
        if held > 0:
            self._open[key] = held
        else:
            self._open.pop(key, None)

    def held(self, host: str) -> int:
        return self._open.get(host, 0)

    def _note_refusal(self, host: str) -> None:
        now = self._clock()
        logged, since = self._refused.get(host, (float("-inf"), 0))
        since += 1
        if now - logged < self.log_interval:
            self._refused[host] = (logged, since)
            return
        log.info(
            "%s holds %s, the per-client cap (SENDQUEUE_HTTP_MAX_CONNECTIONS_PER_CLIENT): "
            "refused %s with 503 since this was last logged",
            host or "a local client",
            plural(self.limit, "connection"),
            plural(since, "connection"),
        )
        self._refused[host] = (now, 0)
        if len(self._refused) > 10_000:  # forget quiet clients; a log line more at worst
            for stale in [h for h, (t, _) in self._refused.items() if now - t >= self.log_interval]:
                del self._refused[stale]
