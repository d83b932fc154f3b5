"""The web application: one factory, :func:`create_app`, and the server that runs it.

``create_app(container)`` wires the routers (:mod:`sendqueue.web.routers`: the API, the pages,
the login routes), ``/static``, the security middlewares (:mod:`sendqueue.web.middleware`),
the error mapping (:mod:`sendqueue.web.errors`) and a
lifespan that owns the live-stream broker and, with ``start_worker=True``, runs the
dispatcher, the send workers and the periodic reconciler in a thread (the embedded default
of ``sendqueue serve``).

:func:`run_server` runs it under uvicorn (:func:`build_server`: with the request limits of
:mod:`sendqueue.web.middleware.limits`): SIGTERM and SIGINT stop the server, end the open event
streams so the shutdown does not wait on them, stop the worker thread (in-flight sends finish)
and close nothing else: the caller owns the container.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import anyio.to_thread
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from sendqueue import __version__
from sendqueue.bootstrap import Container
from sendqueue.bootstrap.stream import change_signal
from sendqueue.runtime import run_worker
from sendqueue.services.operations.attention import AttentionCache, read_attention
from sendqueue.settings import Settings, trusted_networks
from sendqueue.web.bodies import BODY_OVERHEAD_BYTES, add_body_schemas
from sendqueue.web.deps import BackgroundProvisioning
from sendqueue.web.errors import http_exception_response, install_error_handlers
from sendqueue.web.middleware import install_security
from sendqueue.web.middleware.auth import is_api_path
from sendqueue.web.middleware.limits import BodyTimeoutMiddleware, header_timeout_protocol
from sendqueue.web.middleware.peers import PeerCap
from sendqueue.web.middleware.throttle import AuthThrottle, RequestRate
from sendqueue.web.rendering import STATIC_DIR, http_error_page
from sendqueue.web.routers import ROUTERS
from sendqueue.web.stream import ChangeBroker, StreamConfig

__all__ = ["STATIC_DIR", "Server", "build_server", "create_app", "run_server", "server_url"]

log = logging.getLogger(__name__)

# Seconds shutdown waits for in-flight sends (the worker) and background provisioning.
_WORKER_STOP_TIMEOUT = 60.0
_PROVISION_STOP_TIMEOUT = 5.0
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def create_app(
    container: Container,
    *,
    start_worker: bool = False,
    stream: StreamConfig | None = None,
    reconcile_interval: float | None = None,
    extra_hosts: Iterable[str] = (),
) -> FastAPI:
    """The sendqueue web app over ``container`` (which the caller keeps and closes).

    ``start_worker`` runs :func:`sendqueue.runtime.run_worker` in a background thread for the
    app's lifetime. ``stream`` tunes the live stream (tests shorten its intervals); without it,
    the defaults and ``SENDQUEUE_STREAM_LAG_THRESHOLD``.
    ``extra_hosts`` are answered besides loopback and ``SENDQUEUE_ALLOWED_HOSTS`` (``serve``
    adds the address it binds).
    """
    settings = container.settings
    if stream is None:
        threshold = settings.stream_lag_threshold
        stream = StreamConfig(lag_threshold=threshold, status_interval=min(1.0, threshold / 2))
    broker = ChangeBroker(container.store, stream, change_signal(container.store))
    provisioning = BackgroundProvisioning(container)
    lifespan = _lifespan(
        container,
        broker,
        provisioning,
        start_worker=start_worker,
        reconcile_interval=reconcile_interval,
    )
    # FastAPI's viewers load their scripts from a CDN with no integrity check: not in
    # production, where only the schema (/openapi.json) is served.
    viewers = settings.environment != "production"
    app = FastAPI(
        title="sendqueue",
        version=__version__,
        summary="Scheduled email campaigns: one durable task and one schedule per email.",
        lifespan=lifespan,
        docs_url="/docs" if viewers else None,
        redoc_url="/redoc" if viewers else None,
    )
    app.state.container = container
    app.state.broker = broker
    app.state.provisioning = provisioning
    app.state.unsubscribe_rate = RequestRate(settings.unsubscribe_rate)
    app.state.attention = AttentionCache(
        lambda: read_attention(container.store, container.scheduler)
    )
    install_error_handlers(app)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    for router in ROUTERS:
        app.include_router(router)
    _document_bodies(app)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    _install_middlewares(app, container, extra_hosts)
    return app


def _document_bodies(app: FastAPI) -> None:
    """The schema FastAPI makes, with the request bodies the routes read themselves."""
    make = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            add_body_schemas(make())  # make() keeps the document it returns
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]


def _lifespan(
    container: Container,
    broker: ChangeBroker,
    provisioning: BackgroundProvisioning,
    *,
    start_worker: bool,
    reconcile_interval: float | None,
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the worker thread runs while the app does (with ``start_worker``);
    at shutdown the live streams end, the worker stops (in-flight sends finish) and background
    provisioning is waited for a few seconds (its threads are daemons, resumable)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()
        worker: threading.Thread | None = None
        if start_worker:
            worker = threading.Thread(
                target=_run_worker,
                args=(container, stop, reconcile_interval),
                name="sendqueue-worker",
                daemon=True,
            )
            worker.start()
        try:
            yield
        finally:
            await broker.close()
            stop.set()
            if worker is not None:
                await anyio.to_thread.run_sync(worker.join, _WORKER_STOP_TIMEOUT)
                if worker.is_alive():
                    log.error("the worker did not stop within %.0f s", _WORKER_STOP_TIMEOUT)
            await anyio.to_thread.run_sync(provisioning.join, _PROVISION_STOP_TIMEOUT)

    return lifespan


def _install_middlewares(app: FastAPI, container: Container, extra_hosts: Iterable[str]) -> None:
    """The security middlewares (:func:`install_security`), then the body timeout around
    them all."""
    settings = container.settings
    token = settings.api_token.get_secret_value() if settings.api_token is not None else None
    throttle = AuthThrottle(
        max_failures=settings.auth_max_failures,
        window=settings.auth_failure_window,
        max_lockout=settings.auth_max_lockout,
    )
    install_security(
        app,
        token=token,
        max_body_bytes=settings.max_upload_bytes + BODY_OVERHEAD_BYTES,
        routers=ROUTERS,
        public_max_body_bytes=settings.http_public_max_body_bytes,
        throttle=throttle,
        store=container.store,
        allowed_hosts=(*settings.allowed_host_names, *_public_host(settings), *extra_hosts),
    )
    # Outermost, so that every read of the body is timed, whichever layer makes it.
    app.add_middleware(
        BodyTimeoutMiddleware,
        timeout=settings.http_body_timeout,
        public_timeout=settings.http_public_body_timeout,
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    """No such route (or a method it does not take): an HTML page for a person's browser
    asking for a page, the JSON error for anything else (the API, scripts, assets)."""
    assert isinstance(exc, StarletteHTTPException)
    accept = request.headers.get("accept", "")
    if (
        request.method in {"GET", "HEAD"}
        and "text/html" in accept
        and not is_api_path(request.url.path)
    ):
        return http_error_page(request, exc)
    return http_exception_response(exc)


def _public_host(settings: Settings) -> tuple[str, ...]:
    """The host of SENDQUEUE_PUBLIC_URL, which the unsubscribe links name: always answered."""
    host = urlsplit(settings.public_url).hostname if settings.public_url else None
    return (host,) if host else ()


def _run_worker(container: Container, stop: threading.Event, interval: float | None) -> None:
    try:
        run_worker(container, stop, reconcile_interval=interval)
    except Exception:
        log.exception("the embedded worker stopped with an error; the web app keeps serving")


class Server(uvicorn.Server):
    """uvicorn's server, ending the app's event streams first when it shuts down (they
    would otherwise hold the graceful shutdown open until its timeout)."""

    def __init__(self, config: uvicorn.Config, broker: ChangeBroker) -> None:
        super().__init__(config)
        self._broker = broker

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._broker.close()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """SIGTERM/SIGINT start the graceful shutdown, as in uvicorn, but are not raised again
        afterwards: the caller returns normally and closes what it opened."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in _STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def run_server(
    app: FastAPI,
    *,
    host: str,
    port: int,
    on_started: Callable[[str], None] | None = None,
    log_level: str = "warning",
) -> None:
    """Serve ``app`` until SIGTERM/SIGINT (or ``server.should_exit``); blocks.

    ``on_started`` gets the URL once the socket listens (``port=0`` picks a free port).
    """
    server = build_server(app, host=host, port=port, log_level=log_level)
    if on_started is not None:
        _announce(server, host, on_started)
    server.run()


def build_server(app: FastAPI, *, host: str, port: int, log_level: str = "warning") -> Server:
    """The uvicorn server :func:`run_server` runs, with the request limits of the app's settings
    (:mod:`sendqueue.web.middleware.limits`): a deadline for the headers (408, then closed),
    the keep-alive timeout, the size of the request line and headers (400 above it), the
    connections served at once and per client address (503 above them) and the proxies
    trusted for ``X-Forwarded-Proto`` (``SENDQUEUE_FORWARDED_ALLOW_IPS``). The body deadline
    is the app's own middleware (:func:`create_app`).
    """
    settings = app.state.container.settings
    # Trusted proxies are exempt from the per-client cap: their clients all share their address.
    peer_cap = PeerCap(
        settings.http_max_connections_per_client,
        exempt=trusted_networks(settings.forwarded_allow_ips),
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=10,
        # h11 whatever else is installed: the header deadline is a subclass of its protocol.
        http=header_timeout_protocol(settings.http_header_timeout, peer_cap=peer_cap),
        timeout_keep_alive=settings.http_keep_alive,
        h11_max_incomplete_event_size=settings.http_max_header_bytes,
        limit_concurrency=settings.http_max_connections,
        # X-Forwarded-Proto/-For from these peers only: the Secure cookie behind a TLS proxy.
        proxy_headers=True,
        forwarded_allow_ips=settings.forwarded_allow_ips,
    )
    return Server(config, app.state.broker)


def server_url(server: uvicorn.Server, host: str) -> str:
    """The URL a started server listens on."""
    port = server.servers[0].sockets[0].getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def _announce(server: uvicorn.Server, host: str, on_started: Callable[[str], None]) -> None:
    original = server.startup

    async def startup(sockets: list[socket.socket] | None = None) -> None:
        await original(sockets)
        if server.started:
            on_started(server_url(server, host))

    server.startup = startup  # type: ignore[method-assign]
