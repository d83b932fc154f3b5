"""The web server's settings (timeouts, limits, the login back-off, the live page's refetch
intervals): a base of :class:`sendqueue.settings.Settings`, which reads them with the same
``SENDQUEUE_`` prefix. Kept apart so that each settings module stays readable."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

__all__ = ["WebServerSettings"]


class WebServerSettings(BaseSettings):
    """``SENDQUEUE_HTTP_*``, ``SENDQUEUE_AUTH_*``, the trusted proxies and the live page's
    intervals; validated where they are declared (bounds on each field)."""

    http_header_timeout: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="web server: seconds a client has to send a request's line and headers",
    )
    http_body_timeout: float = Field(
        120.0,
        gt=0,
        le=86400,
        description="web server: seconds a client has to send a request's body (the upload)",
    )
    http_keep_alive: int = Field(
        5, ge=1, le=3600, description="web server: seconds an idle kept-alive connection stays"
    )
    http_max_connections: int = Field(
        1000, ge=1, description="web server: connections served at once (503 beyond)"
    )
    http_max_header_bytes: int = Field(
        16 * 1024, ge=1024, le=1024 * 1024, description="web server: request line and headers"
    )
    http_public_max_body_bytes: int = Field(
        4096,
        ge=512,
        le=1024 * 1024,
        description="web server: body of a request before authentication (POST /login)",
    )
    http_public_body_timeout: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="web server: seconds for the body of a request before authentication",
    )
    http_max_connections_per_client: int = Field(
        32,
        ge=1,
        description="web server: connections one client address holds at once (503 beyond)",
    )
    auth_max_failures: int = Field(
        10, ge=1, le=1000, description="failed token checks per client before the back-off"
    )
    auth_failure_window: float = Field(
        900.0, gt=0, le=86400, description="seconds after which a client's failures are forgotten"
    )
    auth_max_lockout: float = Field(
        3600.0, ge=1, le=86400, description="longest back-off (429) after failed token checks"
    )
    forwarded_allow_ips: str = Field(
        "127.0.0.1",
        description="proxies trusted for X-Forwarded-Proto/-For: IPs or CIDRs, comma-separated, "
        "or *",
    )
    stream_lag_threshold: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="web: seconds the live stream's change-log reader may fail, hang or lag "
        "behind the store before pages are told it is delayed (and poll)",
    )
    ui_refetch_interval: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="web: seconds between a campaign page's background refetches while emails "
        "are Pending or Running and the live stream is healthy",
    )
    ui_poll_interval: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="web: seconds between a page's refetches while emails are Pending or "
        "Running and the live stream is down or delayed",
    )
