"""``/metrics`` on a port of its own, for a process that runs no web app (the worker)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server

from sendqueue.adapters.metrics.prometheus import PrometheusMetrics

__all__ = ["MetricsServer", "serve_metrics"]


@dataclass(frozen=True)
class MetricsServer:
    """A running metrics endpoint; :meth:`close` stops it."""

    host: str
    port: int
    _server: WSGIServer
    _thread: threading.Thread

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_metrics(metrics: PrometheusMetrics, port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Serve ``metrics`` at ``http://host:port/metrics`` (any path answers) from a daemon thread.

    Port 0 picks a free port (see :attr:`MetricsServer.port`). The endpoint has no
    authentication: bind it where only the scraper reaches it.
    """
    server, thread = start_http_server(port, addr=host, registry=metrics.registry)
    return MetricsServer(host, int(server.server_port), server, thread)
