"""The composition root: the one place that turns Settings into adapters and services.

The CLI, the web app and the workers all go through :func:`bootstrap`; tests call it with fakes
(``bootstrap(settings, store=InMemoryTaskStore(), ...)``). Components are built lazily, so a
command that only reads the store never opens the scheduler or the mailer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from sendqueue.adapters.alarm import LoggingAlarm, post_json
from sendqueue.adapters.alarm_mail import MailAlarm
from sendqueue.adapters.clock import SystemClock
from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler
from sendqueue.adapters.mail.factory import SenderMailers, mailer_from_url
from sendqueue.adapters.oauth import OAuthTokens
from sendqueue.adapters.sql import SqlTaskStore, open_store
from sendqueue.bootstrap import campaigns as bootstrap_campaigns
from sendqueue.bootstrap import feedback as bootstrap_feedback
from sendqueue.bootstrap import senders as bootstrap_senders
from sendqueue.bootstrap import webhooks as bootstrap_webhooks
from sendqueue.bootstrap.heap import settle_heap
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.senders import Sender
from sendqueue.domain.wording import plural
from sendqueue.ports import (
    Alarm,
    Clock,
    Dispatcher,
    Events,
    FeedbackSource,
    FlushableAlarm,
    Mailer,
    Scheduler,
    SenderStore,
    StoreBackend,
    Stores,
    SuppressionList,
)
from sendqueue.services.campaigns.controls import CampaignControls
from sendqueue.services.campaigns.creation import CampaignImport
from sendqueue.services.campaigns.preview import CampaignPreviews
from sendqueue.services.config import ServiceConfig
from sendqueue.services.feedback.effects import FeedbackService
from sendqueue.services.feedback.mailboxes import SenderMailboxes
from sendqueue.services.feedback.poll import FeedbackParser, FeedbackPoller
from sendqueue.services.feedback.suppression import SuppressionService
from sendqueue.services.importing.recipients import ImportLimits
from sendqueue.services.operations.dead_letters import DeadLetterQueue
from sendqueue.services.planning.capacity import CapacityPlanner
from sendqueue.services.planning.recovery import Recovery
from sendqueue.services.planning.replanning import Replanner
from sendqueue.services.reading.queries import Queries
from sendqueue.services.scheduling.provisioning import Provisioner
from sendqueue.services.scheduling.reconciler import Reconciler
from sendqueue.services.scheduling.schedules import ScheduleWriter
from sendqueue.services.senders.service import SenderService
from sendqueue.services.sending.worker import SendWorker
from sendqueue.services.sequences.editing import SequenceEditor
from sendqueue.services.sequences.followups import FollowUps
from sendqueue.services.templates.render import TemplateLimits
from sendqueue.services.webhooks import DeadLetterRelay, WebhookDelivery, WebhookService
from sendqueue.settings import Settings, load_settings

if TYPE_CHECKING:
    from sendqueue.adapters.metrics import MetricsServer, PrometheusMetrics
    from sendqueue.services.feedback.unsubscribe import UnsubscribeService
    from sendqueue.services.operations.checks import SetupCheck

__all__ = [
    "Container",
    "bootstrap",
    "import_limits",
    "settle_heap",
    "sql_store_of",
    "upgrade_scheduler_schema",
    "upgrade_store_schema",
]

log = logging.getLogger(__name__)

#: The most dead letters the depth gauge counts in one scrape.
_DEAD_LETTERS_COUNTED = 100_000


def _sqlite_path(url: str) -> Path | None:
    for prefix in ("sqlite:///", "sqlite+pysqlite:///"):
        if url.startswith(prefix):
            return Path(url[len(prefix) :])
    return None


def _required(value: str | None, name: str) -> str:
    """An eventbridge setting (Settings refuse the layer without it; this is the last guard)."""
    if not value:
        raise InvalidField(name, value, "required when SENDQUEUE_EXECUTION=eventbridge")
    return value


def _region_of(arn: str) -> str:
    """The region of an ARN (``arn:aws:lambda:REGION:ACCOUNT:...``)."""
    return arn.split(":")[3]


def _make_parent(url: str) -> None:
    """The embedded default creates the folders of its SQLite files."""
    path = _sqlite_path(url)
    if path is not None and str(path) != ":memory:":
        path.parent.mkdir(parents=True, exist_ok=True)


class Container:
    """Everything a sendqueue process needs, wired once."""

    #: Campaign timezones :meth:`timezone_of` keeps; beyond this the oldest go (bounded memory).
    ZONES_CACHED = 4096

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock | None = None,
        store: StoreBackend | None = None,
        scheduler: Scheduler | None = None,
        mailer: Mailer | None = None,
        alarm: Alarm | None = None,
        events: Events | None = None,
        feedback_sources: list[FeedbackSource] | None = None,
        parse_feedback: FeedbackParser | None = None,
        open_mailbox: Callable[[Sender], FeedbackSource] | None = None,
    ) -> None:
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self._store = store
        self._scheduler = scheduler
        self._mailer = mailer
        self._alarm = alarm
        self._events = events
        self._feedback_sources = feedback_sources
        self.parse_feedback = parse_feedback
        self.open_mailbox = open_mailbox
        self._zones: dict[str, str] = {}
        self._zones_lock = threading.Lock()
        self.config = ServiceConfig(
            max_attempts=settings.max_attempts,
            retry_backoff=settings.retry_backoff,
            auto_pause_after=settings.auto_pause_after,
            stale_after=settings.stale_after,
            reconcile_lease_seconds=settings.reconcile_lease,
            stale_policy=settings.stale_policy,
            max_lateness=settings.max_lateness,
            space_late_sends=settings.space_late_sends,
            provision_concurrency=settings.provision_concurrency,
            provision_chunk=settings.provision_chunk,
            default_timezone=settings.default_timezone,
            default_from=settings.default_from,
            unsubscribe=settings.unsubscribe_links,
            bounce_address=settings.bounce_address,
            secret_key=settings.secret_key.get_secret_value() if settings.secret_key else None,
            trusted_authserv=settings.trusted_authserv_ids,
            sender_mailbox_authserv=settings.sender_mailbox_authserv_ids,
            feedback_interval=settings.feedback_interval,
        )

    # -- adapters --------------------------------------------------------------------------
    @cached_property
    def store(self) -> StoreBackend:
        if self._store is not None:
            return self._store
        if self.settings.database_url.startswith("dynamodb:"):
            # Imported here: boto3 is the optional 'aws' extra. The table is the template's
            # (on-demand, point-in-time recovery): never made here.
            from sendqueue.adapters.dynamodb.store import DynamoDbTaskStore

            return DynamoDbTaskStore.from_url(self.settings.database_url)
        _make_parent(self.settings.database_url)
        return open_store(self.settings.database_url, upgrade=True)

    @cached_property
    def stores(self) -> Stores:
        """The store's ports, one per aggregate, built once; each service gets those it uses."""
        return Stores.of(self.store)

    @cached_property
    def alarm(self) -> Alarm:
        if self._alarm is not None:
            return self._alarm
        s = self.settings
        mail = None
        if s.alarm_email is not None:
            # The campaigns' mailer; the store's lease keeps one email per interval across
            # every process on the store.
            mail = MailAlarm(
                self.mailer,
                self.stores.leases,
                self.clock,
                to_addr=s.alarm_email,
                from_addr=s.alarm_sender,
                interval=s.alarm_email_interval,
                max_items=s.alarm_email_items,
            )
        return LoggingAlarm(s.alarm_webhook, events=self.events, mail=mail)

    def post_to_alarm_webhook(self, document: Mapping[str, object], timeout: float = 10.0) -> bool:
        """POST ``document`` to SENDQUEUE_ALARM_WEBHOOK at once (the AWS alarm function relays
        the SNS topic this way); False when none is set. Raises OSError or ValueError when the
        POST fails, so the caller can retry."""
        url = self.settings.alarm_webhook
        if url is None:
            return False
        post_json(url, document, timeout)
        return True

    @cached_property
    def metrics(self) -> PrometheusMetrics:
        """This container's metrics registry (never the process-global one)."""
        # Imported here: prometheus_client takes ~60 ms to import, which a command that only
        # reads the store does not need.
        from sendqueue.adapters.metrics import PrometheusMetrics

        return PrometheusMetrics(
            dead_letter_depth=lambda: len(self.scheduler.dead_letters(limit=_DEAD_LETTERS_COUNTED))
        )

    @cached_property
    def events(self) -> Events:
        """Where the services and the alarm report what happened: the metrics, unless given."""
        return self._events if self._events is not None else self.metrics

    def metrics_text(self) -> tuple[bytes, str]:
        """The metrics in the Prometheus text format, and its content type (for ``/metrics``)."""
        return self.metrics.render()

    def serve_metrics(self, port: int, host: str = "127.0.0.1") -> MetricsServer:
        """Serve :meth:`metrics_text` on ``host:port`` from a daemon thread (the worker process
        has no web app); ``close()`` the result to stop it."""
        from sendqueue.adapters.metrics import serve_metrics

        return serve_metrics(self.metrics, port, host)

    @cached_property
    def scheduler(self) -> Scheduler:
        if self._scheduler is not None:
            return self._scheduler
        if self.settings.execution == "procrastinate":
            return self._procrastinate()
        if self.settings.execution == "eventbridge":
            return self._eventbridge()
        if _sqlite_path(self.settings.scheduler_url) is None:
            raise InvalidField(
                "SENDQUEUE_SCHEDULER_URL",
                self.settings.scheduler_url,
                "the embedded execution layer needs its own SQLite file (sqlite:///FILE)",
            )
        _make_parent(self.settings.scheduler_url)
        return EmbeddedScheduler(
            self.settings.scheduler_url,
            clock=self.clock,
            alarm=bootstrap_webhooks.dead_letter_log(self, self.alarm),
            concurrency=self.settings.worker_concurrency,
            retry_backoff=self.settings.scheduler_retry_backoff,
            lease_seconds=self.settings.scheduler_lease,
        )

    def _procrastinate(self) -> Scheduler:
        # Imported here: procrastinate is an optional extra ('sendqueue[procrastinate]').
        from sendqueue.adapters.procrastinate.scheduler import ProcrastinateScheduler

        s = self.settings
        return ProcrastinateScheduler(
            s.database_url,
            clock=self.clock,
            alarm=bootstrap_webhooks.dead_letter_log(self, self.alarm),
            concurrency=s.worker_concurrency,
            retry_backoff=s.scheduler_retry_backoff,
            poll_interval=s.poll_interval,
            stalled_after=s.scheduler_lease,
            invocation_timeout=s.stale_after,
            reconcile_interval=s.reconcile_interval,
            pool_size=s.provision_concurrency + 2,
        )

    def _eventbridge(self) -> Scheduler:
        # Imported here: boto3 is the optional 'aws' extra.
        import boto3

        from sendqueue.adapters.eventbridge.scheduler import EventBridgeScheduler

        s = self.settings
        target_arn = _required(s.send_function_arn, "SENDQUEUE_SEND_FUNCTION_ARN")
        dlq_arn = _required(s.dead_letter_queue_arn, "SENDQUEUE_DEAD_LETTER_QUEUE_ARN")
        # The schedules live where the send function does, the queue where its ARN says.
        return EventBridgeScheduler(
            boto3.client("scheduler", region_name=_region_of(target_arn)),
            boto3.client("sqs", region_name=_region_of(dlq_arn)),
            physical_group=_required(s.schedule_group, "SENDQUEUE_SCHEDULE_GROUP"),
            target_arn=target_arn,
            role_arn=_required(s.scheduler_role_arn, "SENDQUEUE_SCHEDULER_ROLE_ARN"),
            dead_letter_url=_required(s.dead_letter_queue_url, "SENDQUEUE_DEAD_LETTER_QUEUE_URL"),
            dead_letter_arn=dlq_arn,
            clock=self.clock,
        )

    @property
    def dispatcher(self) -> Dispatcher:
        if self._scheduler is None and self.settings.execution == "eventbridge":
            raise InvalidField(
                "SENDQUEUE_EXECUTION",
                "eventbridge",
                "EventBridge Scheduler invokes the send Lambda function, so there is no worker "
                "process to run here; run the web UI with `sendqueue serve --no-worker`",
            )
        scheduler = self.scheduler
        if not isinstance(scheduler, Dispatcher):
            raise TypeError(f"{type(scheduler).__name__} has no dispatcher in this process")
        return scheduler

    @cached_property
    def mailer(self) -> Mailer:
        return self._mailer or mailer_from_url(self.settings.mailer)

    @cached_property
    def oauth_tokens(self) -> OAuthTokens:
        """Every sender's OAuth access token (XOAUTH2), its rotated refresh tokens saved."""
        return OAuthTokens(self.sender_store, self.clock)

    @cached_property
    def sender_mailers(self) -> SenderMailers:
        return bootstrap_senders.sender_mailers(self)

    @property
    def injected_mailer(self) -> Mailer | None:
        """The mailer the container was built with (tests), or None."""
        return self._mailer

    def mailer_for(self, sender: Sender) -> Mailer:
        """The mailer a sender sends through (:class:`SenderMailers`: a transport the rules
        refuse fails every send). A test container (built with a mailer) sends every other
        sender's mail through that one."""
        return self.sender_mailers.for_sender(sender)

    # -- services --------------------------------------------------------------------------
    def timezone_of(self, campaign_id: str) -> str:
        """A campaign's policy timezone (it never changes, so it is cached)."""
        with self._zones_lock:
            zone = self._zones.get(campaign_id)
        if zone is None:
            zone = self.store.get_campaign(campaign_id).policy.timezone
            with self._zones_lock:
                if len(self._zones) >= self.ZONES_CACHED:
                    del self._zones[next(iter(self._zones))]
                self._zones[campaign_id] = zone
        return zone

    @cached_property
    def writer(self) -> ScheduleWriter:
        return ScheduleWriter(
            self.scheduler, self.timezone_of, concurrency=self.config.provision_concurrency
        )

    @cached_property
    def suppressions(self) -> SuppressionList:
        """The suppression list: the task store's own (every store keeps one)."""
        return self.stores.suppressions

    @cached_property
    def sender_store(self) -> SenderStore:
        """Senders and their bookings: the task store's own (every store keeps them)."""
        return self.stores.senders

    @cached_property
    def senders(self) -> SenderService:
        return bootstrap_senders.sender_service(self)

    @cached_property
    def suppression(self) -> SuppressionService:
        return SuppressionService(self.suppressions, self.clock)

    @cached_property
    def unsubscribe(self) -> UnsubscribeService:  # what the public /u/<token> routes call
        return bootstrap_feedback.unsubscribe_service(self)

    @cached_property
    def layer_config(self) -> ServiceConfig:
        """The services' config with the execution layer's firing precision: the worker must
        not skip an EventBridge invocation early in its minute, and a re-plan keeps its moved
        sends clear of a kept send's fire."""
        return replace(self.config, firing_precision=float(self.scheduler.firing_precision))

    @cached_property
    def capacity(self) -> CapacityPlanner:
        return bootstrap_campaigns.capacity(self)

    @cached_property
    def replanner(self) -> Replanner:
        return bootstrap_campaigns.replanner(self)

    @cached_property
    def recovery(self) -> Recovery:
        return bootstrap_campaigns.recovery(self)

    @cached_property
    def followups(self) -> FollowUps:
        return bootstrap_campaigns.followups(self)

    @cached_property
    def sequence_editor(self) -> SequenceEditor:
        return bootstrap_campaigns.sequence_editor(self)

    @cached_property
    def campaign_import(self) -> CampaignImport:
        return bootstrap_campaigns.campaign_import(self)

    @cached_property
    def campaign_previews(self) -> CampaignPreviews:
        return bootstrap_campaigns.campaign_previews(self)

    @cached_property
    def campaign_controls(self) -> CampaignControls:
        return bootstrap_campaigns.campaign_controls(self)

    @cached_property
    def queries(self) -> Queries:
        return Queries.over(self.store, self.stores.senders, self.clock)

    @cached_property
    def provisioner(self) -> Provisioner:
        return bootstrap_campaigns.provisioner(self)

    @cached_property
    def worker(self) -> SendWorker:
        return bootstrap_campaigns.worker(self)

    @cached_property
    def reconciler(self) -> Reconciler:
        return bootstrap_campaigns.reconciler(self)

    @cached_property
    def feedback(self) -> FeedbackService:
        return bootstrap_feedback.feedback_service(self)

    @cached_property
    def feedback_sources(self) -> list[FeedbackSource]:
        if self._feedback_sources is not None:
            return self._feedback_sources
        return bootstrap_feedback.feedback_sources(self)

    @cached_property
    def mailboxes(self) -> SenderMailboxes:
        return bootstrap_feedback.sender_mailboxes(self)

    @cached_property
    def feedback_poller(self) -> FeedbackPoller:
        return bootstrap_feedback.feedback_poller(self)

    @cached_property
    def dead_letter_relay(self) -> DeadLetterRelay:
        return bootstrap_webhooks.dead_letter_relay(self)

    @cached_property
    def dead_letter_queue(self) -> DeadLetterQueue:
        return bootstrap_webhooks.dead_letter_queue(self)

    @cached_property
    def webhook_delivery(self) -> WebhookDelivery:
        return bootstrap_webhooks.webhook_delivery(self)

    @cached_property
    def webhooks(self) -> WebhookService:
        return bootstrap_webhooks.webhook_service(self)

    @cached_property
    def setup_check(self) -> SetupCheck:
        """``sendqueue check``: every configured part, tried for real when it runs."""
        from sendqueue.bootstrap.checks import setup_check

        return setup_check(self)

    def invoke(self, payload: Mapping[str, str]) -> None:
        """The execution layer's target: routes an invocation by its ``kind``."""
        kind = payload.get("kind", "send")
        if kind == "send":
            self.worker.send(payload)
        elif kind == "provision":
            self.provisioner.provision(payload["campaign_id"])
        elif kind == "reconcile":  # the procrastinate layer's periodic task
            self.reconciler.run()
        else:
            log.error("unknown invocation kind %r: %s", kind, dict(payload))

    def close(self) -> None:
        """Close what was opened; give queued alarm webhooks a moment to go out."""
        alarm = self.__dict__.get("alarm")
        if isinstance(alarm, FlushableAlarm):
            alarm.flush(5.0)
        for name in ("worker", "feedback_poller", "sender_mailers", "mailer", "scheduler", "store"):
            if name in self.__dict__:
                try:
                    getattr(self, name).close()
                except Exception:  # closing must not mask the error that got us here
                    log.exception("closing %s failed", name)


def bootstrap(
    settings: Settings | None = None,
    *,
    clock: Clock | None = None,
    store: StoreBackend | None = None,
    scheduler: Scheduler | None = None,
    mailer: Mailer | None = None,
    alarm: Alarm | None = None,
    events: Events | None = None,
    feedback_sources: list[FeedbackSource] | None = None,
    parse_feedback: FeedbackParser | None = None,
    open_mailbox: Callable[[Sender], FeedbackSource] | None = None,
) -> Container:
    """Build the container from settings (read from the environment when not given; refused
    ones raise :class:`~sendqueue.domain.errors.InvalidSettings`)."""
    return Container(
        settings or load_settings(Settings),
        clock=clock,
        store=store,
        scheduler=scheduler,
        mailer=mailer,
        alarm=alarm,
        events=events,
        feedback_sources=feedback_sources,
        parse_feedback=parse_feedback,
        open_mailbox=open_mailbox,
    )


def upgrade_store_schema(settings: Settings) -> str | None:
    """Apply the task store's migrations to ``settings.database_url``; the revision it is at.

    DynamoDB has no schema revisions: its table is the template's, and the upgrade gives task
    items of older releases the address key of the ``by_address`` index."""
    if settings.database_url.startswith("dynamodb:"):
        from sendqueue.adapters.dynamodb.store import DynamoDbTaskStore

        store = DynamoDbTaskStore.from_url(settings.database_url)
        try:
            added = store.backfill_address_keys()
        finally:
            store.close()
        return f"dynamodb (address keys added to {plural(added, 'task')})"
    from sendqueue.adapters.sql.migrate import current, upgrade

    upgrade(settings.database_url)
    return current(settings.database_url)


def upgrade_scheduler_schema(settings: Settings) -> str | None:
    """Apply procrastinate's schema when it is the execution layer (its version); else None."""
    if settings.execution != "procrastinate":
        return None
    # Imported here: procrastinate is the optional 'procrastinate' extra.
    from sendqueue.adapters.procrastinate.schema import upgrade_schema

    return upgrade_schema(settings.database_url)


def sql_store_of(container: Container) -> SqlTaskStore:
    """The container's task store, which must be the SQL one (``db migrate-to`` writes to it)."""
    store = container.store
    assert isinstance(store, SqlTaskStore)
    return store


def import_limits(settings: Settings) -> ImportLimits:
    """The bounds of an import (a CSV or JSON rows and their templates) from the settings."""
    return ImportLimits(
        max_bytes=settings.max_upload_bytes,
        max_rows=settings.max_recipients,
        templates=TemplateLimits(
            max_source_bytes=settings.max_template_bytes,
            max_html_source_bytes=settings.max_html_template_bytes,
            max_output_chars=settings.max_rendered_chars,
            max_html_output_chars=settings.max_rendered_html_chars,
            row_seconds=settings.template_row_seconds,
            max_range=settings.template_max_range,
            max_tags=settings.template_max_tags,
        ),
    )
