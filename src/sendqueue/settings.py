"""All configuration, in one pydantic-settings class.

Every setting is read from an environment variable prefixed ``SENDQUEUE_`` (or a ``.env`` file
in the working directory). Only :mod:`sendqueue.bootstrap` reads this class; adapters receive
plain values and never read the environment themselves.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit, urlunsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .domain.errors import InvalidField
from .domain.policy import load_timezone

__all__ = ["Settings", "redact_url"]

_LOOPBACK = {"localhost", "127.0.0.1", "::1", ""}


class Settings(BaseSettings):
    """sendqueue's settings. See the README's configuration table for each variable."""

    model_config = SettingsConfigDict(
        env_prefix="SENDQUEUE_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        # a refused SENDQUEUE_MAILER or DATABASE_URL must not print its password back
        hide_input_in_errors=True,
    )

    environment: Literal["development", "production"] = Field(
        "development", description="production refuses unsafe defaults"
    )
    database_url: str = Field(
        "sqlite:///./sendqueue.db",
        description="task store: sqlite:///FILE or postgresql+psycopg://",
    )
    scheduler_url: str = Field(
        "sqlite:///./sendqueue-scheduler.db",
        description="embedded execution layer's own SQLite file",
    )
    execution: Literal["embedded", "procrastinate"] = Field(
        "embedded",
        description="execution layer: embedded (one machine) or procrastinate (PostgreSQL, many)",
    )
    mailer: str = Field(
        "maildir:./outbox",
        description="maildir:DIR or smtp://user:pass@host:port?security=starttls|tls|none",
    )
    default_timezone: str = Field("Europe/Berlin", description="policy timezone when none given")
    default_from: str = Field("sendqueue@example.com", description="From address when none given")
    alarm_webhook: str | None = Field(None, description="URL POSTed when a send is dead-lettered")
    reconcile_interval: float = Field(1800.0, gt=0, description="seconds between reconciler passes")
    reconcile_lease: float = Field(
        120.0, ge=1, description="seconds a dead reconciler pass blocks the next one"
    )
    stale_after: float = Field(
        900.0, ge=1, description="seconds before Running counts as stale (longer than a send)"
    )
    stale_policy: Literal["retry", "fail"] = Field(
        "retry", description="what to do with stale Running"
    )
    max_attempts: int = Field(3, ge=1, le=20, description="send attempts per email in all")
    retry_backoff: float = Field(60.0, ge=0, description="seconds before a transient retry")
    auto_pause_after: int = Field(5, ge=0, description="pause after N permanent failures in a row")
    provision_concurrency: int = Field(10, ge=1, le=100, description="scheduler calls in flight")
    scheduler_retry_backoff: float = Field(
        5.0, ge=0, description="execution layer: seconds before retrying a failed invocation"
    )
    scheduler_lease: float = Field(
        60.0,
        ge=1,
        description="execution layer: seconds before a dead invocation fires again (embedded "
        "lease; procrastinate worker heartbeat timeout)",
    )
    poll_interval: float = Field(
        0.5, gt=0, le=60, description="procrastinate layer: seconds between polls for due jobs"
    )
    worker_concurrency: int = Field(4, ge=1, le=64, description="sends in flight per process")
    max_upload_bytes: int = Field(50 * 1024 * 1024, ge=1024, description="largest CSV accepted")
    max_recipients: int = Field(1_000_000, ge=1, description="most rows one campaign may have")
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
    api_token: SecretStr | None = Field(None, description="required for the web UI and API")

    @field_validator("default_timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            load_timezone(value, "SENDQUEUE_DEFAULT_TIMEZONE")
        except InvalidField as exc:
            raise ValueError(str(exc)) from exc
        return value

    @field_validator("database_url", "scheduler_url")
    @classmethod
    def _known_database(cls, value: str) -> str:
        scheme = value.split(":", 1)[0]
        if scheme not in {"sqlite", "sqlite+pysqlite", "postgresql", "postgresql+psycopg"}:
            raise ValueError(
                "expected sqlite:///FILE or postgresql+psycopg://user@host:5432/db, "
                f"got scheme {scheme!r}"
            )
        return value

    @field_validator("mailer")
    @classmethod
    def _known_mailer(cls, value: str) -> str:
        if value.startswith("maildir:"):
            if not value[len("maildir:") :]:
                raise ValueError("maildir: needs a directory, e.g. maildir:./outbox")
            return value
        parts = urlsplit(value)
        if parts.scheme != "smtp" or not parts.hostname:
            raise ValueError("expected maildir:DIR or smtp://user:pass@host:port?security=...")
        query = parse_qs(parts.query)
        unknown = sorted(set(query) - {"security", "timeout"})
        if unknown:
            raise ValueError(f"unknown smtp:// parameter {unknown[0]!r}; use security, timeout")
        security = query.get("security", ["starttls"])[0]
        if security not in {"starttls", "tls", "none"}:
            raise ValueError(f"security must be starttls, tls or none, got {security!r}")
        # checked here, not at the first send: a mailer that cannot be built would send every
        # invocation to the dead-letter queue
        timeout = query.get("timeout", ["30"])[0]
        try:
            seconds = float(timeout)
        except ValueError:
            raise ValueError(f"timeout must be a number of seconds, got {timeout!r}") from None
        if not 0 < seconds < float("inf"):
            raise ValueError(f"timeout must be greater than 0, got {timeout!r}")
        try:
            parts.port  # noqa: B018 - raises for a port out of range
        except ValueError as exc:
            raise ValueError(f"the port is not valid: {exc}") from None
        return value

    @field_validator("alarm_webhook")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value and urlsplit(value).scheme not in {"http", "https"}:
            raise ValueError("the alarm webhook must be an http:// or https:// URL")
        return value or None

    @model_validator(mode="after")
    def _execution_needs_postgres(self) -> Settings:
        """procrastinate keeps its jobs next to the task store, on PostgreSQL."""
        if self.execution == "procrastinate" and not self.database_url.startswith("postgresql"):
            scheme = self.database_url.split(":", 1)[0]
            raise ValueError(
                "SENDQUEUE_EXECUTION=procrastinate needs a PostgreSQL task store: set "
                "SENDQUEUE_DATABASE_URL=postgresql+psycopg://user@host:5432/db (it is "
                f"{scheme}); move an existing SQLite deployment with `sendqueue db migrate-to`"
            )
        return self

    @model_validator(mode="after")
    def _refuse_unsafe(self) -> Settings:
        """Refuse settings that would leak credentials or lose mail."""
        parts = urlsplit(self.mailer) if self.mailer.startswith("smtp") else None
        if parts is not None and parts.password:
            security = parse_qs(parts.query).get("security", ["starttls"])[0]
            if security == "none" and (parts.hostname or "") not in _LOOPBACK:
                raise ValueError(
                    "SENDQUEUE_MAILER: refusing to send a password unencrypted to "
                    f"{parts.hostname}; use security=starttls or security=tls"
                )
        if self.api_token is not None and len(self.api_token.get_secret_value()) < 16:
            raise ValueError("SENDQUEUE_API_TOKEN: must be at least 16 characters long")
        if self.environment == "production":
            if self.api_token is None:
                raise ValueError(
                    "SENDQUEUE_API_TOKEN is required when SENDQUEUE_ENVIRONMENT=production"
                )
            if self.mailer.startswith("maildir:"):
                raise ValueError(
                    "SENDQUEUE_MAILER: the Maildir outbox delivers nothing; set an smtp:// "
                    "mailer when SENDQUEUE_ENVIRONMENT=production"
                )
        return self

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        """repr() and str() show URLs without their secrets (the token is a SecretStr)."""
        for name, value in super().__repr_args__():
            if name in _URL_FIELDS and isinstance(value, str):
                value = redact_url(value, path=name == "alarm_webhook")
            yield name, value


_URL_FIELDS = frozenset({"database_url", "scheduler_url", "mailer", "alarm_webhook"})


def redact_url(url: str, *, path: bool = False) -> str:
    """``url`` with the password replaced by ``***``; with ``path``, also the path and query
    (a webhook URL's path is often its secret)."""
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        return url
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, host = netloc.rpartition("@")
        netloc = f"{userinfo.split(':', 1)[0]}:***@{host}"
    if path:
        return f"{parts.scheme}://{netloc}/***" if parts.path or parts.query else url
    return urlunsplit(parts._replace(netloc=netloc))
