"""All configuration, in one pydantic-settings class.

Every setting is read from an environment variable prefixed ``SENDQUEUE_``, over a settings
file: the one :mod:`sendqueue.settings.file` picks for the CLI (``--config``,
``./sendqueue.env``, ``./.env``), ``./.env`` for ``Settings()`` alone. Only
:mod:`sendqueue.bootstrap` reads this class; adapters receive plain values and never read the
environment themselves. Entry points load it through
:func:`load_settings`, whose error names the variables in plain sentences.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from sendqueue.adapters.dynamodb.url import DynamoDbUrl, parse_dynamodb_url
from sendqueue.adapters.imap.url import check_imap_url
from sendqueue.adapters.mail.url import UNREADABLE, check_mailer_url
from sendqueue.domain.addresses import normalize_sender
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.policy import load_timezone
from sendqueue.domain.transports import TransportRules

from .checks import (
    is_host_name,
    redact_url,
    refuse_guessable,
    trusted_networks,
)
from .errors import load_settings
from .webhooks import WebhookSettings

__all__ = [
    "DynamoDbUrl",
    "LambdaControlSettings",
    "LambdaSettings",
    "Settings",
    "load_settings",
    "parse_dynamodb_url",
    "redact_url",
    "trusted_networks",
]

# An authserv-id as servers write it: a host name (RFC 8601 allows any value; every real one is
# a dot-atom without spaces or ";").
_AUTHSERV_ID = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,252})")
_SCHEDULE_GROUP = re.compile(r"[0-9a-zA-Z_.\-]{1,64}")
_LAMBDA_ARN = re.compile(
    r"arn:aws[a-zA-Z-]*:lambda:[a-z]{2}(-[a-z]+)+-\d+:\d{12}:function:[a-zA-Z0-9_\-]{1,64}"
    r"(:[a-zA-Z0-9$_\-]{1,128})?"
)
_ROLE_ARN = re.compile(r"arn:aws[a-zA-Z-]*:iam::\d{12}:role/[\w+=,.@/\-]{1,512}")
_QUEUE_ARN = re.compile(
    r"arn:aws[a-zA-Z-]*:sqs:[a-z]{2}(-[a-z]+)+-\d+:\d{12}:[\w\-]{1,80}(\.fifo)?"
)
#: What SENDQUEUE_EXECUTION=eventbridge needs, in the order the error names them.
_EVENTBRIDGE_FIELDS = (
    "schedule_group",
    "send_function_arn",
    "scheduler_role_arn",
    "dead_letter_queue_url",
    "dead_letter_queue_arn",
)


def _check_postgres_url(url: str, variable: str) -> None:
    """Raise ValueError naming ``variable`` (never the URL: it may hold a password) unless
    SQLAlchemy, which opens the store, can take ``url`` apart, with a valid host and port."""
    from sqlalchemy import make_url  # here: only a PostgreSQL URL needs it
    from sqlalchemy.exc import ArgumentError

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises for a port that is not a number in 0..65535
        make_url(url)
    except (ValueError, ArgumentError) as exc:
        # the parsers' own words may quote the netloc or the port (a piece of the password)
        reason = str(exc).split(":", 1)[0] if isinstance(exc, ArgumentError) else str(exc)
        if isinstance(exc, ValueError) and reason != "Port out of range 0-65535":
            reason = UNREADABLE
        raise ValueError(
            f"{variable}: not a valid PostgreSQL URL ({reason}); expected "
            "postgresql+psycopg://user:password@host:5432/db"
        ) from None


def _sqlite_url(url: str) -> bool:
    return url.split(":", 1)[0] in {"sqlite", "sqlite+pysqlite"}


class Settings(WebhookSettings):
    """sendqueue's settings. docs/settings.md lists each variable, rendered from these fields
    by :mod:`sendqueue.settings.reference`."""

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
        description="task store: sqlite:///FILE, postgresql+psycopg://, or dynamodb://TABLE",
    )
    scheduler_url: str = Field(
        "sqlite:///./sendqueue-scheduler.db",
        description="embedded execution layer's own SQLite file",
    )
    execution: Literal["embedded", "procrastinate", "eventbridge"] = Field(
        "embedded",
        description="execution layer: embedded (one machine), procrastinate (PostgreSQL, many) "
        "or eventbridge (EventBridge Scheduler invoking the send Lambda)",
    )
    schedule_group: str | None = Field(
        None, description="eventbridge: the dedicated EventBridge Scheduler schedule group"
    )
    send_function_arn: str | None = Field(
        None, description="eventbridge: ARN of the send Lambda function the schedules invoke"
    )
    scheduler_role_arn: str | None = Field(
        None, description="eventbridge: role the Scheduler assumes (may invoke only the send one)"
    )
    provision_function_arn: str | None = Field(
        None,
        description="eventbridge, the reconcile function: the provision Lambda function it hands "
        "a resumed provisioning run on to before its timeout (unset: a control schedule)",
    )
    dead_letter_queue_url: str | None = Field(
        None, description="eventbridge: URL of the SQS dead-letter queue"
    )
    dead_letter_queue_arn: str | None = Field(
        None, description="eventbridge: ARN of the same SQS dead-letter queue"
    )
    mailer: str = Field(
        "maildir:./outbox",
        description="the campaigns' and the alarms' transport: maildir:DIR, "
        "smtp://user:pass@host:port?security=starttls|tls|none&timeout=30, or "
        "ses:REGION?configuration_set=NAME (Amazon SES, the aws extra)",
    )
    default_timezone: str = Field("Europe/Berlin", description="policy timezone when none given")
    default_from: str = Field("sendqueue@example.com", description="From address when none given")
    alarm_webhook: str | None = Field(
        None, description="URL POSTed for each alarm (a dead letter, an auto-paused campaign)"
    )
    alarm_email: str | None = Field(
        None,
        description="operator address the alarms are emailed to, through SENDQUEUE_MAILER (a "
        "digest, at most one per SENDQUEUE_ALARM_EMAIL_INTERVAL)",
    )
    alarm_from: str | None = Field(
        None, description="From of the alarm emails [default: SENDQUEUE_DEFAULT_FROM]"
    )
    alarm_email_interval: float = Field(
        600.0, ge=1, le=86400, description="seconds between two alarm emails, across processes"
    )
    alarm_email_items: int = Field(
        20, ge=1, le=1000, description="alarms one email lists in full (the rest are counted)"
    )
    reconcile_interval: float = Field(1800.0, gt=0, description="seconds between reconciler passes")
    reconcile_lease: float = Field(
        120.0, ge=1, description="seconds a dead reconciler pass blocks the next one"
    )
    stale_after: float = Field(
        900.0, ge=1, description="seconds before Running counts as stale (longer than a send)"
    )
    stale_policy: Literal["retry", "fail"] = Field(
        "retry",
        description="a task Running past SENDQUEUE_STALE_AFTER: retry sends it again "
        "(at-least-once), fail marks it Failed, outcome unknown (at-most-once)",
    )
    max_lateness: float = Field(
        300.0,
        ge=0,
        description="seconds past its send time after which an email is not sent but moved, "
        "with the campaign's other Pending ones, to the next free slots",
    )
    space_late_sends: bool = Field(
        True,
        description="an email sent late (within max_lateness) that would come within half the "
        "planned spacing of another send of its campaign is moved to a free slot instead; "
        "false sends such a backlog as fast as the worker can (the throughput benchmark)",
    )
    follow_up_linger: float = Field(
        0.25,
        ge=0,
        le=10,
        description="a worker process makes its sends' next sequence steps together once no "
        "send marked one for this many seconds (20 times it at the latest); 0: each right "
        "after its send, as the eventbridge layer always does",
    )
    max_attempts: int = Field(3, ge=1, le=20, description="send attempts per email in all")
    retry_backoff: float = Field(
        60.0,
        ge=0,
        description="seconds before the first transient retry (doubling each time; the retry "
        "takes the first free slot of the grid after it)",
    )
    auto_pause_after: int = Field(
        5, ge=0, description="pause a campaign after N permanent failures in a row (0: never)"
    )
    provision_concurrency: int = Field(10, ge=1, le=100, description="scheduler calls in flight")
    provision_chunk: int = Field(
        1000,
        ge=10,
        le=10_000,
        description="emails provisioned per chunk: one plan, one write and one checkpoint each "
        "(a chunk's recipients are in memory at once)",
    )
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
    max_template_bytes: int = Field(
        64 * 1024, ge=1024, le=16 * 1024 * 1024, description="subject+body templates, bytes"
    )
    max_html_template_bytes: int = Field(
        1024 * 1024, ge=1024, le=64 * 1024 * 1024, description="html template, bytes"
    )
    max_rendered_chars: int = Field(
        100_000, ge=1000, le=10_000_000, description="rendered subject or text body, characters"
    )
    max_rendered_html_chars: int = Field(
        1_000_000, ge=1000, le=100_000_000, description="rendered html body, characters"
    )
    template_row_seconds: float = Field(
        0.1, gt=0, le=60, description="time to render one recipient's templates"
    )
    template_max_range: int = Field(
        10_000, ge=1, le=10_000_000, description="most numbers one range() in a template gives"
    )
    template_max_tags: int = Field(
        2_000, ge=10, le=1_000_000, description="most {{ }} and {% %} tags in one template"
    )
    max_json_body_bytes: int = Field(
        8 * 1024 * 1024,
        ge=1024,
        le=1024 * 1024 * 1024,
        description="largest JSON body of a campaign create or preview; bigger lists go as a CSV",
    )
    api_token: SecretStr | None = Field(
        None,
        description="when set, every page and API route requires it (16+ characters, not "
        "guessable: python -c 'import secrets; print(secrets.token_urlsafe(32))'); required to "
        "serve on a non-loopback address and in production",
    )
    unsubscribe_rate: int = Field(
        60,
        ge=1,
        le=100_000,
        description="web server: requests to the public unsubscribe routes (/u/...) one client "
        "address may make per minute (429 beyond)",
    )
    bounce_address: str | None = Field(
        None,
        description="envelope sender (Return-Path) of every email, VERP-encoded per task: "
        "bounces@example.com becomes bounces+TOKEN@example.com (needs SENDQUEUE_SECRET_KEY)",
    )
    feedback_imap: str | None = Field(
        None,
        description="the feedback mailbox (bounces, complaints, replies): "
        "imap://user:pass@host:143/INBOX?security=starttls|tls|none or imaps://",
    )
    trusted_authserv: str = Field(
        "",
        description="comma-separated authserv-ids (e.g. mx.google.com) whose "
        "Authentication-Results header proves a reply's From when it passes DMARC, aligned "
        "DKIM or SPF; your mail server must remove such headers that arrive with its id",
    )
    suppress_replies: bool = Field(
        False,
        description="also put an address that replied on the suppression list (reason "
        "replied): one conversation per recipient, ever",
    )
    feedback_interval: float = Field(
        60.0, ge=1, le=86400, description="seconds between two polls of the feedback mailbox"
    )
    feedback_parse_seconds: float = Field(
        2.0,
        description="the most seconds one feedback message may take to parse (0.1..60), in a "
        "child process; past it the message is skipped",
    )
    allowed_hosts: str = Field(
        "",
        description="web server: comma-separated host names (or IP addresses) answered besides "
        "127.0.0.1, localhost and [::1]; any other Host header gets 400 (DNS rebinding)",
    )

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
    def _known_database(cls, value: str, info: ValidationInfo) -> str:
        scheme = value.split(":", 1)[0]
        if scheme == "dynamodb" and info.field_name == "database_url":
            try:
                parse_dynamodb_url(value)
            except InvalidField as exc:
                raise ValueError(exc.reason) from None
            return value
        if scheme not in {"sqlite", "sqlite+pysqlite", "postgresql", "postgresql+psycopg"}:
            also = ", or dynamodb://TABLE" if info.field_name == "database_url" else ""
            raise ValueError(
                f"expected sqlite:///FILE or postgresql+psycopg://user@host:5432/db{also}, "
                f"got scheme {scheme!r}"
            )
        if scheme.startswith("postgresql"):
            _check_postgres_url(value, f"SENDQUEUE_{(info.field_name or '').upper()}")
        return value

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _trusted_proxies(cls, value: str) -> str:
        try:
            trusted_networks(value)
        except ValueError as exc:
            raise ValueError(f"SENDQUEUE_FORWARDED_ALLOW_IPS: {exc}") from None
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, value: str) -> str:
        for name in (part.strip() for part in value.split(",")):
            if name and not is_host_name(name):
                raise ValueError(
                    f"SENDQUEUE_ALLOWED_HOSTS: {name[:100]!r} is not a host name or IP address "
                    "(no scheme, port, path or wildcard; any port is accepted)"
                )
        return value

    @property
    def allowed_host_names(self) -> tuple[str, ...]:
        """``allowed_hosts`` as lower-case names, IPv6 addresses without brackets."""
        names = (part.strip().lower() for part in self.allowed_hosts.split(","))
        return tuple(name.strip("[]") for name in names if name)

    @field_validator("schedule_group")
    @classmethod
    def _schedule_group(cls, value: str | None) -> str | None:
        if value is not None and not _SCHEDULE_GROUP.fullmatch(value):
            raise ValueError(
                "a schedule group name is 1 to 64 characters of letters, digits, '-', '_' and '.'"
            )
        return value or None

    @field_validator("send_function_arn", "provision_function_arn")
    @classmethod
    def _function_arn(cls, value: str | None) -> str | None:
        if value is not None and not _LAMBDA_ARN.fullmatch(value):
            raise ValueError(
                "expected a Lambda function ARN, arn:aws:lambda:REGION:ACCOUNT:function:NAME"
            )
        return value or None

    @field_validator("scheduler_role_arn")
    @classmethod
    def _role_arn(cls, value: str | None) -> str | None:
        if value is not None and not _ROLE_ARN.fullmatch(value):
            raise ValueError("expected an IAM role ARN, arn:aws:iam::ACCOUNT:role/NAME")
        return value or None

    @field_validator("dead_letter_queue_arn")
    @classmethod
    def _queue_arn(cls, value: str | None) -> str | None:
        if value is not None and not _QUEUE_ARN.fullmatch(value):
            raise ValueError("expected an SQS queue ARN, arn:aws:sqs:REGION:ACCOUNT:NAME")
        return value or None

    @field_validator("dead_letter_queue_url")
    @classmethod
    def _queue_url(cls, value: str | None) -> str | None:
        if value is not None and (
            urlsplit(value).scheme not in {"http", "https"} or not urlsplit(value).hostname
        ):
            raise ValueError(
                "expected an SQS queue URL, https://sqs.REGION.amazonaws.com/ACCOUNT/NAME"
            )
        return value or None

    @field_validator("mailer")
    @classmethod
    def _known_mailer(cls, value: str) -> str:
        # The mailer's own parser: a URL accepted here builds a mailer, so no send can
        # dead-letter for a malformed one; and never a password in plain text to another host.
        try:
            check_mailer_url(value, TransportRules())
        except InvalidField as exc:
            raise ValueError(f"SENDQUEUE_MAILER: {exc.reason}") from None
        return value

    @field_validator("feedback_parse_seconds")
    @classmethod
    def _parse_budget(cls, value: float) -> float:
        if not 0.1 <= value <= 60:  # NaN too
            raise ValueError(f"SENDQUEUE_FEEDBACK_PARSE_SECONDS: 0.1 to 60 seconds, not {value}")
        return value

    @field_validator("feedback_imap")
    @classmethod
    def _imap_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        try:
            check_imap_url(value, TransportRules())
        except InvalidField as exc:
            raise ValueError(f"SENDQUEUE_FEEDBACK_IMAP: {exc.reason}") from None
        return value

    @field_validator("trusted_authserv")
    @classmethod
    def _authserv_ids(cls, value: str) -> str:
        for name in (part.strip() for part in value.split(",")):
            if name and not _AUTHSERV_ID.fullmatch(name):
                raise ValueError(
                    f"SENDQUEUE_TRUSTED_AUTHSERV: {name!r} is no authserv-id (a host name such "
                    "as mx.google.com, as your server writes it first in Authentication-Results)"
                )
        return value

    @property
    def trusted_authserv_ids(self) -> frozenset[str]:
        """The authserv-ids of SENDQUEUE_TRUSTED_AUTHSERV, lower-cased."""
        return frozenset(p.strip().lower() for p in self.trusted_authserv.split(",") if p.strip())

    @field_validator("alarm_webhook")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value and urlsplit(value).scheme not in {"http", "https"}:
            raise ValueError("the alarm webhook must be an http:// or https:// URL")
        return value or None

    @field_validator("alarm_email", "alarm_from", "bounce_address")
    @classmethod
    def _mailbox(cls, value: str | None, info: ValidationInfo) -> str | None:
        # The campaigns' own address rules: what passes here, the mailers accept as To/From.
        if not value or not value.strip():
            return None
        name = f"SENDQUEUE_{(info.field_name or '').upper()}"
        try:
            return normalize_sender(value, name)
        except InvalidField as exc:
            raise ValueError(f"{name}: {exc.reason}") from None

    @property
    def alarm_sender(self) -> str:
        """The From of the alarm emails: SENDQUEUE_ALARM_FROM, else SENDQUEUE_DEFAULT_FROM (the
        campaigns' default sender, which a relay or SES already accepts)."""
        return self.alarm_from or self.default_from

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
    def _eventbridge_needs_its_resources(self) -> Settings:
        """The EventBridge layer writes schedules that point at resources the template made."""
        if self.execution != "eventbridge":
            return self
        missing = [
            f"SENDQUEUE_{name.upper()}" for name in _EVENTBRIDGE_FIELDS if not getattr(self, name)
        ]
        if missing:
            raise ValueError(
                f"SENDQUEUE_EXECUTION=eventbridge needs {', '.join(missing)} (the SAM "
                "template sets them on every function; see docs/deploy-aws.md)"
            )
        if _sqlite_url(self.database_url):
            raise ValueError(
                "SENDQUEUE_EXECUTION=eventbridge needs a task store every Lambda function "
                "shares: set SENDQUEUE_DATABASE_URL=dynamodb://TABLE (or a PostgreSQL URL), "
                "not a SQLite file"
            )
        return self

    @model_validator(mode="after")
    def _bounce_address_needs_the_key(self) -> Settings:
        """A VERP address is signed: without the key no DSN could be matched to its task."""
        if self.bounce_address is not None:
            if "<" in self.bounce_address:
                raise ValueError("SENDQUEUE_BOUNCE_ADDRESS: a bare address, without a name")
            if self.secret_key is None:
                raise ValueError(
                    "SENDQUEUE_BOUNCE_ADDRESS needs SENDQUEUE_SECRET_KEY, which signs the VERP "
                    "address of every email"
                )
        return self

    @model_validator(mode="after")
    def _feedback_needs_the_key(self) -> Settings:
        """Feedback is proven by signed Message-IDs and VERP addresses: without the key, no
        bounce, complaint or reply read from the mailbox could be believed."""
        if self.feedback_imap is not None and self.secret_key is None:
            raise ValueError(
                "SENDQUEUE_FEEDBACK_IMAP needs SENDQUEUE_SECRET_KEY, which signs the "
                "Message-ID of every email: a bounce or a reply counts only when it proves the "
                "email it is about"
            )
        return self

    @model_validator(mode="after")
    def _refuse_unsafe(self) -> Settings:
        """Refuse settings that would leak credentials or lose mail."""
        if self.api_token is not None and len(self.api_token.get_secret_value()) < 16:
            raise ValueError("SENDQUEUE_API_TOKEN: must be at least 16 characters long")
        if self.api_token is not None:
            refuse_guessable(self.api_token.get_secret_value(), "SENDQUEUE_API_TOKEN")
        if self.environment == "production" and self._needs_unsubscribe_links:
            self._require_unsubscribe_links()
        if self.environment == "production":
            if self.api_token is None and self._serves_http:
                raise ValueError(
                    "SENDQUEUE_API_TOKEN is required when SENDQUEUE_ENVIRONMENT=production"
                )
            if self.mailer.startswith("maildir:"):
                raise ValueError(
                    "SENDQUEUE_MAILER: the Maildir outbox delivers nothing; set an smtp:// "
                    "mailer when SENDQUEUE_ENVIRONMENT=production"
                )
        return self

    @property
    def transport_rules(self) -> TransportRules:
        """What the senders' own transports may be (production, the allow-list)."""
        return TransportRules(self.environment == "production", self.transport_host_patterns)

    #: The process may serve the web UI and the API, which the token guards.
    _serves_http: ClassVar[bool] = True
    #: The process sends mail or serves the unsubscribe routes: production needs the links.
    _needs_unsubscribe_links: ClassVar[bool] = True

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        """repr() and str() show URLs without their secrets (the token is a SecretStr)."""
        for name, value in super().__repr_args__():
            if name in _URL_FIELDS and isinstance(value, str):
                value = redact_url(value, path=name == "alarm_webhook")
            yield name, value


_URL_FIELDS = frozenset(
    {"database_url", "scheduler_url", "mailer", "alarm_webhook", "feedback_imap"}
)


class LambdaSettings(Settings):
    """The settings of sendqueue's send function (:mod:`sendqueue.lambda_handlers`).

    The same variables and rules, except that ``SENDQUEUE_ENVIRONMENT=production`` does not
    require ``SENDQUEUE_API_TOKEN``: a function serves no web UI or API for it to guard, and a
    secret it never uses should not sit in its environment. Production does require
    ``SENDQUEUE_PUBLIC_URL`` (https) and the secret key, as for every process that sends: the
    SAM template gives the key as ``SENDQUEUE_SECRET_KEY_ARN``, read at the cold start.
    """

    _serves_http: ClassVar[bool] = False


class LambdaControlSettings(LambdaSettings):
    """The settings of the functions that send no campaign email: provision, reconcile, the
    alarm relay and feedback. They neither make nor check an unsubscribe link, so production
    does not require the public URL or the key, and their roles may not read the secret."""

    _needs_unsubscribe_links: ClassVar[bool] = False
