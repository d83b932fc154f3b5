"""What routes get from the app: each the services it uses, the stream broker and background
provisioning.

``create_app`` puts the container, the broker and the provisioning runner on ``app.state``;
routes (the API's and the pages') take what they use of them as ``Annotated`` dependencies,
never the container itself nor the store::

    @router.get("/campaigns/{campaign_id}")
    def page(campaign_id: str, queries: QueriesDep, request: Request) -> HTMLResponse: ...

Reads go through :class:`~sendqueue.services.reading.queries.Queries` (``QueriesDep``); writes
through
the service that owns them (``CampaignsDep``, ``SendersDep``, ...).

``request.state.csrf_token`` holds the CSRF token a page puts into its forms and its
``<meta name="csrf-token">`` (set by :class:`sendqueue.web.middleware.csrf.CsrfMiddleware`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Protocol

from fastapi import Depends, Request

from sendqueue.bootstrap import Container, import_limits
from sendqueue.domain.wording import plural
from sendqueue.services.campaigns.controls import CampaignControls
from sendqueue.services.campaigns.creation import CampaignImport
from sendqueue.services.campaigns.preview import CampaignPreviews
from sendqueue.services.feedback.mailboxes import SenderMailboxes
from sendqueue.services.feedback.suppression import SuppressionService
from sendqueue.services.feedback.unsubscribe import UnsubscribeService
from sendqueue.services.importing.recipients import ImportLimits
from sendqueue.services.operations.dead_letters import DeadLetterQueue
from sendqueue.services.reading.queries import Queries
from sendqueue.services.senders.service import SenderService
from sendqueue.services.sequences.editing import SequenceEditor
from sendqueue.services.webhooks import WebhookService
from sendqueue.settings import Settings
from sendqueue.web.stream import ChangeBroker

__all__ = [
    "BackgroundProvisioning",
    "BrokerDep",
    "CampaignImportDep",
    "CampaignsDep",
    "ClockDep",
    "DeadLettersDep",
    "ImportLimitsDep",
    "MailboxesDep",
    "MetricsTextDep",
    "PreviewsDep",
    "ProvisioningDep",
    "QueriesDep",
    "SendersDep",
    "SettingsDep",
    "SuppressionDep",
    "UnsubscribeDep",
    "WebhooksDep",
    "get_broker",
    "get_campaigns",
    "get_provisioning",
    "get_queries",
]

log = logging.getLogger(__name__)


class BackgroundProvisioning:
    """Runs ``provisioner.provision`` in a thread per request, so the API answers at once.

    The threads are daemons: a server that stops mid-way leaves the campaign provisioning with
    its checkpoint, and the next run (or the reconciler) continues from there. A failure is
    logged; the campaign stays in provisioning until then.
    """

    def __init__(self, container: Container) -> None:
        self._container = container
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}

    def start(self, campaign_id: str) -> bool:
        """Start provisioning ``campaign_id`` unless this process is at it already."""
        with self._lock:
            running = self._threads.get(campaign_id)
            if running is not None and running.is_alive():
                return False
            thread = threading.Thread(
                target=self._run,
                args=(campaign_id,),
                name=f"sendqueue-provision-{campaign_id}",
                daemon=True,
            )
            self._threads[campaign_id] = thread
        thread.start()
        return True

    def _run(self, campaign_id: str) -> None:
        try:
            report = self._container.provisioner.provision(campaign_id)
        except Exception:
            log.exception(
                "provisioning %s failed; it stays in provisioning until it is run again or the "
                "reconciler resumes it",
                campaign_id,
            )
            return
        finally:
            with self._lock:
                if self._threads.get(campaign_id) is threading.current_thread():
                    del self._threads[campaign_id]
        if report.status == "done":
            log.info(
                "provisioned %s: %s, %s in %.1f s",
                campaign_id,
                plural(report.tasks_created, "task"),
                plural(report.schedules_created, "schedule"),
                report.seconds,
            )
        else:
            log.warning(
                "provisioning %s ended %s: %s", campaign_id, report.status, report.errors[:3]
            )

    def running(self) -> list[str]:
        with self._lock:
            return [cid for cid, t in self._threads.items() if t.is_alive()]

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds in all for the running threads (shutdown)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = list(self._threads.values())
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))


class Clock(Protocol):
    """What a route asks of the clock (the container's, a fake one in tests)."""

    def now(self) -> datetime: ...


def _container(request: Request) -> Container:
    container: Container = request.app.state.container
    return container


def get_settings(request: Request) -> Settings:
    return _container(request).settings


def get_clock(request: Request) -> Clock:
    return _container(request).clock


def get_queries(request: Request) -> Queries:
    """The read side: every page's and API read's data."""
    return _container(request).queries


def get_campaigns(request: Request) -> CampaignControls:
    """A campaign's controls: provisioning, pause, resume, cancel, retry-failed."""
    return _container(request).campaign_controls


def get_campaign_import(request: Request) -> CampaignImport:
    """Creating a campaign: its recipients checked and stored."""
    return _container(request).campaign_import


def get_sequence_editor(request: Request) -> SequenceEditor:
    """Editing a running sequence: a step added, a step's text changed."""
    return _container(request).sequence_editor


def get_previews(request: Request) -> CampaignPreviews:
    """The plan of a stored campaign or of a draft, as its preview shows it."""
    return _container(request).campaign_previews


def get_import_limits(request: Request) -> ImportLimits:
    return import_limits(_container(request).settings)


def get_senders(request: Request) -> SenderService:
    return _container(request).senders


def get_mailboxes(request: Request) -> SenderMailboxes:
    return _container(request).mailboxes


def get_suppression(request: Request) -> SuppressionService:
    return _container(request).suppression


def get_webhooks(request: Request) -> WebhookService:
    return _container(request).webhooks


def get_unsubscribe(request: Request) -> UnsubscribeService:
    return _container(request).unsubscribe


def get_dead_letters(request: Request) -> DeadLetterQueue:
    return _container(request).dead_letter_queue


def get_metrics_text(request: Request) -> Callable[[], tuple[bytes, str]]:
    """The metrics in the Prometheus text format and its content type, when called."""
    return _container(request).metrics_text


def get_broker(request: Request) -> ChangeBroker:
    broker: ChangeBroker = request.app.state.broker
    return broker


def get_provisioning(request: Request) -> BackgroundProvisioning:
    runner: BackgroundProvisioning = request.app.state.provisioning
    return runner


SettingsDep = Annotated[Settings, Depends(get_settings)]
ClockDep = Annotated[Clock, Depends(get_clock)]
QueriesDep = Annotated[Queries, Depends(get_queries)]
CampaignsDep = Annotated[CampaignControls, Depends(get_campaigns)]
CampaignImportDep = Annotated[CampaignImport, Depends(get_campaign_import)]
SequenceEditorDep = Annotated[SequenceEditor, Depends(get_sequence_editor)]
PreviewsDep = Annotated[CampaignPreviews, Depends(get_previews)]
ImportLimitsDep = Annotated[ImportLimits, Depends(get_import_limits)]
SendersDep = Annotated[SenderService, Depends(get_senders)]
MailboxesDep = Annotated[SenderMailboxes, Depends(get_mailboxes)]
SuppressionDep = Annotated[SuppressionService, Depends(get_suppression)]
WebhooksDep = Annotated[WebhookService, Depends(get_webhooks)]
UnsubscribeDep = Annotated[UnsubscribeService, Depends(get_unsubscribe)]
DeadLettersDep = Annotated[DeadLetterQueue, Depends(get_dead_letters)]
MetricsTextDep = Annotated[Callable[[], tuple[bytes, str]], Depends(get_metrics_text)]
BrokerDep = Annotated[ChangeBroker, Depends(get_broker)]
ProvisioningDep = Annotated[BackgroundProvisioning, Depends(get_provisioning)]
