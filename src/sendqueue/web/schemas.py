"""The API's response models (what ``/openapi.json`` documents as each success body) and the
error shape every route may answer besides.

The campaign, task and dead-letter views are :mod:`sendqueue.services.reading.views`, the ones the
CLI
prints; the models here wrap or extend them.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from pydantic import BaseModel, Field

from sendqueue.services.reading.views import (
    CampaignView,
    DeadLetterView,
    IsoTime,
    SuppressionView,
    TaskView,
    iso,
)
from sendqueue.services.webhooks import DeliveryPage, DeliveryView, WebhookCreated, WebhookView

__all__ = [
    "READ_ERRORS",
    "WRITE_ERRORS",
    "CampaignDetail",
    "CampaignList",
    "CampaignWithTimeline",
    "CreatedCampaign",
    "DeadLetterList",
    "DeliveryList",
    "DeliveryOut",
    "DeliveryPageOut",
    "ErrorBody",
    "ErrorInfo",
    "FunnelStep",
    "Health",
    "ImportSummary",
    "Plan",
    "PlanDay",
    "PlanSend",
    "PlanStep",
    "PlanStepDay",
    "PlanZone",
    "Redriven",
    "RetriedCampaign",
    "SenderDetail",
    "SenderList",
    "SenderMailbox",
    "SenderOAuth",
    "SenderOut",
    "SenderRemoved",
    "SenderUsageDay",
    "SuppressionAdded",
    "SuppressionImported",
    "SuppressionPage",
    "SuppressionRemoved",
    "TaskPage",
    "TimelineDay",
    "WebhookList",
    "WebhookOut",
    "WebhookRemoved",
    "WebhookWithSecret",
    "error_responses",
]


class CampaignDetail(CampaignView):
    """A campaign with its counts (``campaign show --json``) and when it sends next."""

    next_send_at: IsoTime | None


class CampaignList(BaseModel):
    campaigns: list[CampaignDetail]


class ImportSummary(BaseModel):
    rows: int
    duplicates: int
    duplicate_rows: list[int]


class CreatedCampaign(CampaignDetail):
    """A new draft, with what the import made of the recipients."""

    imported: ImportSummary = Field(alias="import")


class RetriedCampaign(CampaignDetail):
    affected: int = Field(description="how many Failed emails are sent again")


class TimelineDay(BaseModel):
    day: str = Field(json_schema_extra={"format": "date"})
    planned: int
    done: int


class FunnelStep(BaseModel):
    """What became of one step's emails made so far."""

    step: int
    made: int = Field(description="its emails made so far, whatever their state")
    sent: int = Field(description="Finished, whatever came back")
    answered: int = Field(description="sent and replied to")
    stopped: int = Field(description="cancelled, or sent and bounced, unsubscribed or complained")
    pending: int = Field(description="Pending or Running")
    failed: int


class CampaignWithTimeline(CampaignDetail):
    timeline: list[TimelineDay] = Field(description="planned and done emails per local day")
    funnel: list[FunnelStep] | None = Field(
        None,
        description="a sequence's steps, each with what became of its emails (a later step's "
        "email is made when the step before it is sent); null for a campaign of one email",
    )


class PlanSend(BaseModel):
    index: int
    send_at: IsoTime
    local: str = Field(description="the send time in the policy's zone, with its offset")
    email: str | None = Field(None, description="left out where the plan has no recipients")
    zone: str | None = Field(
        None,
        description="the zone the send is planned in (its recipient's in a local-time "
        "campaign, else the campaign's)",
    )
    sender: str | None = Field(
        None, description='who it goes out from, "Name <address>": its planned sender or the From'
    )


class PlanDay(BaseModel):
    day: str = Field(json_schema_extra={"format": "date"})
    count: int
    first: str
    last: str


class PlanZone(BaseModel):
    """The sends to the recipients of one zone, per local day of that zone."""

    zone: str = Field(description="a recipient's own zone, or the campaign's")
    count: int
    days: list[PlanDay] = Field(description="per local day of this zone, times in it")


class PlanStepDay(BaseModel):
    day: str = Field(json_schema_extra={"format": "date"})
    count: int


class PlanStep(BaseModel):
    """One step of a sequence: its expected sends per local day of the campaign's zone."""

    step: int
    after: str | None = Field(
        description="its wait after the step before (3d, 4h, 30m); null: step 1"
    )
    count: int
    days: list[PlanStepDay]


class Plan(BaseModel):
    """When each email would be sent (the first 1,000, in time order), and how many per day
    (all)."""

    policy_text: str
    timezone: str
    count: int
    duplicates: int
    sends: list[PlanSend]
    days: list[PlanDay]
    zones: list[PlanZone] | None = Field(
        None,
        description="the sends per recipient zone, each in its own local days (one zone, the "
        "campaign's, unless it sends in local time)",
    )
    local_time: bool = Field(
        False, description="whether the windows are read in each recipient's own zone"
    )
    zone_names: dict[str, dict[str, str]] | None = Field(
        None,
        description="the abbreviations of the zones named here by UTC offset in minutes, e.g. "
        '{"Europe/Berlin": {"60": "CET", "120": "CEST"}}',
    )
    steps: list[PlanStep] | None = Field(
        None,
        description="a sequence's expected sends per local day and step: step 1 as planned, "
        "each later step at its earliest instant after the one before; an estimate that "
        "assumes no one answers and ignores capacity (per_day, sender caps). Absent for a "
        "campaign of one email",
    )
    steps_note: str | None = Field(None, description="what the steps estimate assumes")


class TaskPage(BaseModel):
    tasks: list[TaskView]
    next: int | None = Field(description="the cursor of the next page (`after`), or null")


class DeadLetterList(BaseModel):
    dead_letters: list[DeadLetterView]


class Redriven(BaseModel):
    redriven: list[str] = Field(description="the dead letters turned back into schedules")
    schedules: list[str] = Field(description="the schedules made, in the same order")
    skipped: list[str] = Field(
        default_factory=list, description="letters someone else redrove meanwhile"
    )
    failed_again: list[str] = Field(
        default_factory=list,
        description="new letters of schedules this pass redrove, which failed again at once",
    )


class SuppressionPage(BaseModel):
    suppressions: list[SuppressionView]
    total: int = Field(description="how many addresses are on the list")
    next: str | None = Field(description="the cursor of the next page (`after`), or null")


class SuppressionAdded(SuppressionView):
    """The entry on the list now: the first one, when the address was listed already."""

    new: bool = Field(description="false when the address was listed already (kept as it was)")


class SuppressionRemoved(BaseModel):
    removed: str = Field(description="the address taken off the list, as compared")


class SuppressionImported(BaseModel):
    rows: int = Field(description="rows of the file")
    added: int = Field(description="addresses new on the list")
    kept: int = Field(description="rows whose address was listed already (or repeated)")


class SenderOAuth(BaseModel):
    """A sender's OAuth grant as shown: the refresh token and a client secret as ``***``."""

    token_url: str
    client_id: str
    scope: str | None
    refresh_token: str = Field(description="always ***")
    client_secret: str | None = Field(description="*** when there is one")


class SenderOut(BaseModel):
    """A sender (``sender list --json``): its transport masked, never its password."""

    id: str
    email: str
    name: str
    reply_to: str | None
    transport: str | None = Field(
        description="its own mailer URL, masked (smtp://user:***@host:587); null: the "
        "configured mailer (SENDQUEUE_MAILER)"
    )
    daily_cap: int = Field(description="emails a day at most, per local day of its timezone")
    min_gap_seconds: int = Field(description="seconds between two of its sends at least")
    timezone: str = Field(description="the IANA zone its days (and so its cap) are counted in")
    warmup_start: int | None = Field(description="the warm-up's cap on its first sending day")
    warmup_step: int | None = Field(description="how much the cap grows per sending day")
    warmup_from: str | None = Field(
        description="the day the warm-up was set (the sender's local date): its sending days "
        "(days with an email) from then on count",
        json_schema_extra={"format": "date"},
    )
    imap: str | None = Field(
        description="its own mailbox's URL, masked (imaps://user:***@host:993/INBOX); null: none"
    )
    signature_text: str = Field(description="its signature as text (empty: none)")
    signature_html: str | None = Field(description="its signature's HTML form; null: none")
    oauth: SenderOAuth | None = Field(description="its OAuth 2.0 grant, secrets as ***")


class SenderUsageDay(BaseModel):
    date: str = Field(json_schema_extra={"format": "date"}, description="a local day")
    planned: int = Field(description="emails planned that day, not sent yet")
    sent: int = Field(description="emails sent that day")
    cap: int = Field(description="the day's cap (the warm-up's, where it is lower)")


class SenderMailbox(BaseModel):
    """A sender's own mailbox as the feedback poll last saw it."""

    mailbox: str = Field(description="its IMAP URL without the password")
    polled_at: IsoTime | None = Field(description="when its last pass ended; null: not yet")
    messages_read: int = Field(description="messages read from it, every pass added up")
    last_error: str | None = Field(
        description="why its last pass failed, credentials masked; null: it went through"
    )


class SenderDetail(SenderOut):
    """A sender with its usage per local day from today (``sender show --json``), and its
    own mailbox's state (null: it has none)."""

    usage: list[SenderUsageDay]
    mailbox: SenderMailbox | None = None


class SenderList(BaseModel):
    senders: list[SenderOut]


class SenderRemoved(BaseModel):
    removed: str = Field(description="the id of the sender deleted")
    email: str


class WebhookOut(BaseModel):
    """A webhook endpoint (``webhook list --json``): its secret masked."""

    id: str = Field(description="wh_ and 16 hex digits")
    url: str
    event_types: list[str] = Field(description="the event types it receives; empty: all")
    campaign_ids: list[str] = Field(description="the campaigns it hears about; empty: all")
    enabled: bool
    disabled_reason: str | None = Field(description="why it is disabled; null when enabled")
    created_at: IsoTime
    secret: str | None = Field(description="masked: whsec_*** and its last 4 characters")
    previous_secret_expires_at: IsoTime | None = Field(
        description="until when the previous secret signs too (after a rotation); null: none"
    )
    cursor: int = Field(description="the change-log id delivered up to")
    attempts: int = Field(description="failed attempts of the event at its head (0: none)")
    retry_at: IsoTime | None = Field(description="when its head event is tried again")
    failing_since: IsoTime | None = Field(description="since when its head event fails")

    @classmethod
    def of(cls, view: WebhookView) -> WebhookOut:
        return cls(
            **{
                **asdict(view),
                "created_at": iso(view.created_at),
                "previous_secret_expires_at": iso(view.previous_secret_expires_at),
                "retry_at": iso(view.retry_at),
                "failing_since": iso(view.failing_since),
            }
        )


class WebhookList(BaseModel):
    webhooks: list[WebhookOut]


class WebhookWithSecret(WebhookOut):
    """An endpoint just added or rotated: ``signing_secret`` is shown this once."""

    signing_secret: str = Field(
        description="whsec_ and base64; store it now, it is not shown again"
    )

    @classmethod
    def created(cls, made: WebhookCreated) -> WebhookWithSecret:
        return cls(**WebhookOut.of(made.endpoint).model_dump(), signing_secret=made.secret)


class WebhookRemoved(BaseModel):
    removed: str = Field(description="the id of the endpoint deleted")


class DeliveryOut(BaseModel):
    """One delivery attempt from the log (kept 7 days)."""

    event_id: str
    event_type: str
    at: IsoTime
    attempt: int = Field(description="1 for the first try of the event")
    latency_ms: int
    status: int | None = Field(description="the HTTP status; null when none came back")
    error: str | None = Field(description="a short reason (never the response body); null: ok")
    redelivery: bool = Field(description="asked for by a user (redeliver)")
    ok: bool

    @classmethod
    def of(cls, view: DeliveryView) -> DeliveryOut:
        return cls(**{**asdict(view), "at": iso(view.at)})


class DeliveryList(BaseModel):
    deliveries: list[DeliveryOut]


class DeliveryPageOut(DeliveryList):
    """A page of an endpoint's delivery log, newest first."""

    next: str | None = Field(
        description="the cursor of the next, older page (pass it as `before`); null at the end"
    )

    @classmethod
    def of(cls, page: DeliveryPage) -> DeliveryPageOut:
        return cls(deliveries=[DeliveryOut.of(d) for d in page.deliveries], next=page.next)


class ErrorInfo(BaseModel):
    """The inside of every error response (docs/api.md, "Errors")."""

    status: int
    message: str
    field: str | None = None
    reason: str | None = None
    value: Any = None
    errors: list[dict[str, Any]] | None = Field(
        None, description="with several problems (rows of a CSV): each with row, field, reason"
    )
    total: int | None = Field(None, description="how many problems in all")


class ErrorBody(BaseModel):
    """Every error the API answers: ``{"error": {...}}``."""

    error: ErrorInfo


class Health(BaseModel):
    """``GET /healthz``: ``ok``, or ``unavailable`` with the error."""

    status: str
    error: ErrorInfo | None = None


_ERROR_TEXT = {
    401: "no or wrong token (`WWW-Authenticate: Bearer`)",
    403: "CSRF token missing or wrong (session cookie requests)",
    404: "unknown campaign, task, dead letter, suppressed address, sender or webhook",
    409: "illegal transition or conflict (an address taken, a sender with planned emails)",
    413: "body or CSV larger than SENDQUEUE_MAX_UPLOAD_BYTES",
    415: "not the body's documented media type",
    422: "invalid input, naming the field or the rows",
    503: "the store or the execution layer is unreachable (`Retry-After`)",
}

#: What every API route may answer besides its success.
READ_ERRORS = (401, 422, 503)
WRITE_ERRORS = (401, 403, 422, 503)


def error_responses(*statuses: int, json_only: bool = False) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for these error statuses, all in the one error shape.

    ``json_only`` for a route whose success is not JSON (the event stream, the metrics):
    FastAPI would document its errors in the success's media type, but errors are JSON.
    """
    if json_only:
        ref = {"$ref": "#/components/schemas/ErrorBody"}
        return {
            s: {"description": _ERROR_TEXT[s], "content": {"application/json": {"schema": ref}}}
            for s in statuses
        }
    return {s: {"model": ErrorBody, "description": _ERROR_TEXT[s]} for s in statuses}
