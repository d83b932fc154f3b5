"""Recovering from an outage: the catch-up re-plans, and the cause each one names.

Three things start a catch-up (:class:`Recovery`), each re-planning a campaign's Pending emails
with :class:`~sendqueue.services.planning.replanning.Replanner` and writing one reason on every
email it
moves (``moved_reason``) and in one log line per campaign:

- a worker starting (:meth:`Recovery.after_start`, before its dispatcher fires anything):
  every active campaign with a Pending email due more than the firing slack before now. The
  worker was down from the first send it missed (the earliest such send time, over all
  campaigns) until it started: ``worker down 23:41-23:43 UTC``. The first send missed is what
  the store knows for certain: the last change before the gap only proves the worker was alive
  then, and a campaign idle for the night would date an outage of minutes hours back;
- the worker meeting an overdue or late send it fired (:meth:`Recovery.catch_up`);
- the reconciler finding an overdue send (:meth:`Recovery.catch_up_overdue`).

The cause is named from what this process saw (:class:`OutageWatch`): a send due before its
worker started is ``worker down`` (the window found at start); one that waited while its store
calls failed is ``store unreachable`` (from the first failure seen to the first answer); any
other is ``fired late`` (from its send time to its fire) or, found by the reconciler, ``not
fired``. Nothing of this is stored: another process (the reconcile Lambda, a second worker)
names what it saw itself.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from sendqueue.domain.errors import StoreUnavailable
from sendqueue.domain.lifecycle import CampaignState
from sendqueue.domain.outages import Outage, OutageCause
from sendqueue.ports import Campaigns, Clock
from sendqueue.services.config import ServiceConfig
from sendqueue.services.planning.replanning import FIRING_SLACK, Replanner

__all__ = ["OutageWatch", "Recovery"]

#: Store outages a process remembers (the newest ones): a send waits for at most a few.
_STORE_OUTAGES_KEPT = 16


class OutageWatch:
    """What this process saw: when its worker started (and the outage found then), and when the
    task store failed and answered again. Thread-safe; the send path pays one attribute read
    while the store answers."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._started: datetime | None = None
        self._down_since: datetime | None = None
        self._failing_since: datetime | None = None
        self._store_down: deque[tuple[datetime, datetime]] = deque(maxlen=_STORE_OUTAGES_KEPT)

    def start(self, at: datetime) -> None:
        """The worker of this process starts at ``at`` (a restart in the same process, as
        tests do, ends the outage it found before)."""
        with self._lock:
            self._started = at
            self._down_since = None

    def worker_down(self, since: datetime) -> Outage:
        """The outage that ended when this worker started: from ``since``, the first send it
        missed (or an earlier one already recorded)."""
        with self._lock:
            if self._started is None:
                raise RuntimeError("worker_down before start")
            if self._down_since is None or since < self._down_since:
                self._down_since = since
            return Outage(OutageCause.WORKER_DOWN, self._down_since, self._started)

    @contextmanager
    def store_calls(self) -> Iterator[None]:
        """Around calls to the task store: StoreUnavailable is a failure seen (and raised on),
        a return an answer."""
        try:
            yield
        except StoreUnavailable:
            self.store_failed()
            raise
        self.store_answered()

    def store_failed(self) -> None:
        """A call to the task store failed (StoreUnavailable)."""
        if self._failing_since is None:
            now = self._clock.now()
            with self._lock:
                if self._failing_since is None:
                    self._failing_since = now

    def store_answered(self) -> None:
        """A call to the task store succeeded: a failure seen before has ended."""
        if self._failing_since is None:  # the usual case: no lock, no clock
            return
        now = self._clock.now()
        with self._lock:
            if self._failing_since is not None:
                self._store_down.append((self._failing_since, now))
                self._failing_since = None

    def explain(self, missed: datetime, *, fired: bool) -> Outage:
        """Why a send due at ``missed`` did not go out on time, as this process saw it
        (``fired``: the worker met it at its fire; else the reconciler found it)."""
        now = self._clock.now()
        with self._lock:
            started, down_since = self._started, self._down_since
            windows = list(self._store_down)
            if self._failing_since is not None:
                windows.append((self._failing_since, now))
        if started is not None and missed < started:
            since = missed if down_since is None else min(missed, down_since)
            return Outage(OutageCause.WORKER_DOWN, since, started)
        for since, until in reversed(windows):
            if since <= now and until >= missed:  # the store failed while the send waited
                return Outage(OutageCause.STORE_UNREACHABLE, since, until)
        cause = OutageCause.FIRED_LATE if fired else OutageCause.NOT_FIRED
        return Outage(cause, missed, now)


class Recovery:
    """The catch-up re-plans (see the module docstring)."""

    def __init__(
        self, store: Campaigns, replanner: Replanner, clock: Clock, config: ServiceConfig
    ) -> None:
        self._store = store
        self._replanner = replanner
        self._clock = clock
        self._config = config
        self.watch = OutageWatch(clock)

    def reason(self, missed: datetime) -> str:
        """The reason for moving a campaign whose send due at ``missed`` just fired late."""
        return self.watch.explain(missed, fired=True).reason

    def catch_up(
        self,
        campaign_id: str,
        *,
        since: datetime,
        reason: str | None = None,
        firing: str | None = None,
        fire_within: timedelta = timedelta(0),
        wait: float = 0.0,
    ) -> int:
        """Re-plan an active campaign that missed its sends since ``since`` (an overdue one
        met by the worker, or found by :meth:`catch_up_overdue`), or whose late send would
        come too close to another (``reason`` given, ``firing`` the task given back). Without
        ``reason``, it names why the send due at ``since`` fired late. ``fire_within``: see
        :meth:`Replanner.replan_pending`. Returns how many moved."""
        campaign = self._store.get_campaign(campaign_id)
        if campaign.state is not CampaignState.ACTIVE:
            return 0
        if reason is None:
            reason = self.reason(since)
        moved = self._replanner.replan_pending(
            campaign,
            reason=reason,
            schedule_all=False,
            firing=firing,
            fire_within=fire_within,
            wait=wait,
        )
        return moved or 0

    def catch_up_overdue(self) -> int:
        """Re-plan every active campaign with a Pending email more than ``max_lateness`` past
        its send time (the reconciler, each pass). Returns how many moved."""
        overdue = self._replanner.overdue_campaigns(self._clock.now())
        return sum(
            self.catch_up(cid, since=since, reason=self.watch.explain(since, fired=False).reason)
            for cid, since in overdue.items()
        )

    def after_start(self) -> int:
        """A worker starts (before its dispatcher fires): re-plan every active campaign with a
        Pending email late by more than the firing slack (and the layer's precision), the
        reason naming the worker down from the first send missed until now. Of those due less
        than ``max_lateness`` ago, one may go out at once (as in any catch-up); the others keep
        half the spacing from its fire, which comes once every campaign is re-planned. Returns
        how many moved. With ``space_late_sends`` off, a backlog due within ``max_lateness`` is
        sent as fast as the worker can, as that setting promises: only what is more than
        ``max_lateness`` late moves."""
        now = self._clock.now()
        self.watch.start(now)
        late = FIRING_SLACK + timedelta(seconds=self._config.firing_precision)
        if not self._config.space_late_sends:
            late = max(late, timedelta(seconds=self._config.max_lateness))
        missed = self._replanner.overdue_campaigns(now, late=late)
        if not missed:
            return 0
        outage = self.watch.worker_down(min(missed.values()))
        return sum(
            self.catch_up(cid, since=since, reason=outage.reason, fire_within=late)
            for cid, since in missed.items()
        )
