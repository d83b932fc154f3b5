"""A minimal, thread-safe metrics registry that renders the Prometheus text format.

Hand-written on purpose: ``prometheus_client`` is not a dependency, and sendqueue needs only
counters, gauges and one label-less histogram, which take less code than a dependency's pin.
The output follows the text exposition format 0.0.4 (``# HELP``, ``# TYPE``, one sample a line,
``_bucket{le=...}``/``_sum``/``_count`` for histograms), so any Prometheus server scrapes it.

The metrics the whole system records are defined here, once, on :data:`REGISTRY`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence

__all__ = [
    "ALARMS_TOTAL",
    "DEAD_LETTERS_TOTAL",
    "DEAD_LETTER_DEPTH",
    "RECONCILER_REPAIRS_TOTAL",
    "REGISTRY",
    "SENDS_TOTAL",
    "SEND_LATENESS_SECONDS",
    "Counter",
    "Gauge",
    "Histogram",
    "Registry",
    "render",
]

_Labels = tuple[tuple[str, str], ...]


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


def _escape(value: str, *, quote: bool) -> str:
    out = value.replace("\\", "\\\\").replace("\n", "\\n")
    return out.replace('"', '\\"') if quote else out


def _label_text(labels: _Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v, quote=True)}"' for k, v in labels)
    return "{" + inner + "}"


class Registry:
    """Holds metrics by name and renders them all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._metrics: dict[str, _Metric] = {}

    def register(self, metric: _Metric) -> None:
        with self._lock:
            if metric.name in self._metrics:
                raise ValueError(f"metric {metric.name!r} is already registered")
            self._metrics[metric.name] = metric

    def render(self) -> str:
        """Every metric in Prometheus text format, in registration order."""
        with self._lock:
            metrics = list(self._metrics.values())
        return "".join(m.render() for m in metrics)


class _Metric:
    kind = ""

    def __init__(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        *,
        registry: Registry | None = None,
    ) -> None:
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()
        (REGISTRY if registry is None else registry).register(self)

    def _key(self, labels: dict[str, str]) -> _Labels:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {sorted(labels)}")
        return tuple((n, str(labels[n])) for n in self.labelnames)

    def _header(self) -> str:
        help_text = _escape(self.help, quote=False)
        return f"# HELP {self.name} {help_text}\n# TYPE {self.name} {self.kind}\n"

    def _samples(self) -> Iterable[str]:
        raise NotImplementedError

    def render(self) -> str:
        return self._header() + "".join(line + "\n" for line in self._samples())


class _Valued(_Metric):
    def __init__(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        *,
        registry: Registry | None = None,
    ) -> None:
        super().__init__(name, help, labelnames, registry=registry)
        # A label-less metric is exported as 0 from the start, so rates work from the first
        # scrape; labelled ones appear when a label set is first used.
        self._values: dict[_Labels, float] = {} if self.labelnames else {(): 0.0}

    def value(self, **labels: str) -> float:
        """The current value for ``labels`` (0 when never touched)."""
        key = self._key(labels)
        with self._lock:
            return self._values.get(key, 0.0)

    def _samples(self) -> Iterable[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_label_text(k)} {_number(v)}" for k, v in items]


class Counter(_Valued):
    """A value that only goes up (``inc``)."""

    kind = "counter"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount


class Gauge(_Valued):
    """A value that goes up and down (``set``, ``inc``)."""

    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount


class Histogram(_Metric):
    """Observations counted into cumulative buckets (upper bounds, ``+Inf`` added)."""

    kind = "histogram"

    def __init__(
        self, name: str, help: str, buckets: Sequence[float], *, registry: Registry | None = None
    ) -> None:
        bounds = sorted(float(b) for b in buckets)
        if not bounds or len(set(bounds)) != len(bounds):
            raise ValueError("a histogram needs distinct bucket bounds")
        if not math.isinf(bounds[-1]):
            bounds.append(math.inf)
        self.buckets = tuple(bounds)
        self._counts = [0] * len(self.buckets)
        self._sum = 0.0
        self._count = 0
        super().__init__(name, help, registry=registry)

    def observe(self, value: float) -> None:
        with self._lock:
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    self._counts[i] += 1
                    break
            self._sum += value
            self._count += 1

    @property
    def count(self) -> int:
        with self._lock:
            return self._count

    @property
    def sum(self) -> float:
        with self._lock:
            return self._sum

    def _samples(self) -> Iterable[str]:
        with self._lock:
            counts, total, count = list(self._counts), self._sum, self._count
        lines, running = [], 0
        for bound, n in zip(self.buckets, counts, strict=True):
            running += n
            lines.append(f'{self.name}_bucket{{le="{_number(bound)}"}} {running}')
        lines += [f"{self.name}_sum {_number(total)}", f"{self.name}_count {count}"]
        return lines


#: The process-wide registry that ``render()`` and the web app's ``/metrics`` expose.
REGISTRY = Registry()


def render() -> str:
    """The process-wide metrics in Prometheus text format."""
    return REGISTRY.render()


SENDS_TOTAL = Counter(
    "sendqueue_sends_total",
    "Send attempts by outcome (sent, transient, permanent, skipped).",
    ["outcome"],
)
SEND_LATENESS_SECONDS = Histogram(
    "sendqueue_send_lateness_seconds",
    "Seconds from a task's send_at to the provider accepting the email.",
    [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600],
)
DEAD_LETTERS_TOTAL = Counter(
    "sendqueue_dead_letters_total", "Invocations the execution layer gave up on."
)
DEAD_LETTER_DEPTH = Gauge(
    "sendqueue_dead_letter_depth",
    "Dead letters waiting in the execution layer's queue (read at scrape time).",
)
RECONCILER_REPAIRS_TOTAL = Counter(
    "sendqueue_reconciler_repairs_total", "Drift the reconciler repaired, by kind.", ["kind"]
)
ALARMS_TOTAL = Counter("sendqueue_alarms_total", "Alarms raised.")
