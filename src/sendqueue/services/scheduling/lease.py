"""A provisioning run's lease of its campaign, and the end of a run whose time is spent."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

from sendqueue.domain.errors import Conflict
from sendqueue.ports import Clock, Leases

__all__ = ["LeaseLost", "OutOfTime", "ProvisionLease"]


class OutOfTime(Exception):
    """The run's time is spent: its checkpoint is saved and the rest handed on."""


class LeaseLost(Conflict):
    """Another process took the campaign's provisioning lease: this run writes no more."""


class ProvisionLease:
    """One run's provisioning lease of a campaign: taken at the start, renewed as the chunks
    go by, released at the end. :meth:`tick`, before every chunk, also ends a run whose time
    is spent (:class:`OutOfTime`)."""

    def __init__(
        self,
        store: Leases,
        clock: Clock,
        campaign_id: str,
        ttl: float,
        *,
        deadline: float | None,
        time_left: Callable[[], float] | None,
        margin: float,
    ) -> None:
        self._store = store
        self._clock = clock
        self._campaign_id = campaign_id
        self._name = f"provision:{campaign_id}"
        self._owner = secrets.token_hex(8)
        self._ttl = ttl
        self._deadline = deadline
        self._time_left = time_left
        self._margin = margin
        self._renewed = clock.now()  # when the lease was last taken or renewed

    def take(self) -> bool:
        """False when another process holds it."""
        return self._store.acquire_lease(
            self._name, self._owner, ttl_seconds=self._ttl, at=self._renewed
        )

    def tick(self) -> None:
        # Renewed once a third of it has passed, not with every chunk (one write less per
        # chunk): at every chunk the lease still has two thirds of its time left.
        now = self._clock.now()
        if (now - self._renewed).total_seconds() >= self._ttl / 3:
            if not self._store.acquire_lease(
                self._name, self._owner, ttl_seconds=self._ttl, at=now
            ):
                raise LeaseLost(f"lost the provisioning lease of {self._campaign_id}")
            self._renewed = now
        if self._deadline is not None and time.monotonic() >= self._deadline:
            raise OutOfTime
        if self._time_left is not None and self._time_left() <= self._margin:
            raise OutOfTime

    def release(self) -> None:
        self._store.release_lease(self._name, self._owner)
