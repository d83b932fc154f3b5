"""Metrics: the :class:`~sendqueue.ports.Events` the system emits, recorded with prometheus_client.

:class:`PrometheusMetrics` owns a ``CollectorRegistry`` (never the process-global default one,
so two containers, or two tests, do not share counts); :func:`serve_metrics` exposes it on a
port of its own for a process without the web app (``sendqueue worker``).
"""

from sendqueue.adapters.metrics.prometheus import PrometheusMetrics
from sendqueue.adapters.metrics.server import MetricsServer, serve_metrics

__all__ = ["MetricsServer", "PrometheusMetrics", "serve_metrics"]
