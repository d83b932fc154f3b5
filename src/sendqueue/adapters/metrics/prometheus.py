"""The metrics of sendqueue, in a prometheus_client registry of their own.

Names, types and labels are the documented ones (docs/operations.md); the dead-letter depth is
read from the execution layer at scrape time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import get_args

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from sendqueue.domain.errors import InfrastructureError
from sendqueue.domain.models import DeadLetter
from sendqueue.ports import SendOutcome

__all__ = ["LATENESS_BUCKETS", "PrometheusMetrics"]

log = logging.getLogger(__name__)

# The documented series only: no ``*_created`` wall-clock gauges beside every counter (a
# process-wide switch of prometheus_client, and this adapter is its only user).
disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped upstream

#: Upper bounds (seconds) of the send lateness histogram (``+Inf`` is added).
LATENESS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class _DeadLetterDepth(Collector):
    """``sendqueue_dead_letter_depth``, read when scraped; the last known value while the
    execution layer does not answer."""

    def __init__(self, read: Callable[[], int]) -> None:
        self._read = read
        self._last = 0

    def collect(self) -> Iterator[Metric]:
        try:
            self._last = self._read()
        except InfrastructureError as exc:
            log.warning("metrics: the dead-letter depth is unknown: %s", exc)
        yield GaugeMetricFamily(
            "sendqueue_dead_letter_depth",
            "Dead letters waiting in the execution layer's queue (read at scrape time).",
            value=self._last,
        )


class PrometheusMetrics:
    """Records the system's :class:`~sendqueue.ports.Events`; renders them for a scrape.

    ``dead_letter_depth`` counts the execution layer's dead letters (raising
    InfrastructureError when it cannot); without it the depth gauge is not exported.
    Thread-safe.
    """

    def __init__(self, *, dead_letter_depth: Callable[[], int] | None = None) -> None:
        self.registry = CollectorRegistry()
        self._sends = Counter(
            "sendqueue_sends_total",
            "Send attempts by outcome (sent, transient, permanent, skipped, moved).",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in get_args(SendOutcome):  # exported from zero, so rates work at once
            self._sends.labels(outcome=outcome)
        self._lateness = Histogram(
            "sendqueue_send_lateness_seconds",
            "Seconds from a task's send_at to the provider accepting the email.",
            buckets=LATENESS_BUCKETS,
            registry=self.registry,
        )
        self._dead_letters = Counter(
            "sendqueue_dead_letters_total",
            "Invocations the execution layer gave up on.",
            registry=self.registry,
        )
        if dead_letter_depth is not None:
            self.registry.register(_DeadLetterDepth(dead_letter_depth))
        self._repairs = Counter(
            "sendqueue_reconciler_repairs_total",
            "Drift the reconciler repaired, by kind.",
            ["kind"],
            registry=self.registry,
        )
        self._alarms = Counter("sendqueue_alarms_total", "Alarms raised.", registry=self.registry)

    # -- Events ----------------------------------------------------------------------------
    def send_finished(self, outcome: SendOutcome, lateness: float | None = None) -> None:
        self._sends.labels(outcome=outcome).inc()
        if lateness is not None:
            self._lateness.observe(max(0.0, lateness))

    def dead_lettered(self, letter: DeadLetter) -> None:
        self._dead_letters.inc()

    def alarm_raised(self, letter: DeadLetter) -> None:
        self._alarms.inc()

    def repaired(self, kind: str, n: int) -> None:
        if n > 0:
            self._repairs.labels(kind=kind).inc(n)

    # -- reading ---------------------------------------------------------------------------
    def render(self) -> tuple[bytes, str]:
        """The registry in the Prometheus text format, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_PLAIN_0_0_4

    def value(self, name: str, **labels: str) -> float:
        """One sample's current value (0.0 when it was never recorded), e.g.
        ``value("sendqueue_sends_total", outcome="sent")``."""
        found = self.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found
