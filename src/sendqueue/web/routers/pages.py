"""HTML pages of the web UI: ``/`` (also ``/campaigns``), ``/campaigns/new``, ``/campaigns/{id}``,
``/campaigns/{id}/emails/{task_id}``, ``/dead-letters``, ``/suppressions``, ``/senders``,
``/webhooks`` and ``/webhooks/{id}`` (the login page is :mod:`sendqueue.web.routers.auth`'s).

Routes are thin: they read through the services they take as dependencies (the read side,
:class:`~sendqueue.services.reading.queries.Queries`, in one store call per page where it can; its
timeline cache is the API's) and render a template (:mod:`sendqueue.web.rendering`). The
first render already shows the data; the scripts in ``static/`` then keep it live through the
JSON API and the event stream (docs/api.md). Rows come from the same views the API sends
(:mod:`sendqueue.services.reading.views`), with times shown in the campaign's zone, each with its
zone's abbreviation (:mod:`sendqueue.web.times`).
"""

from __future__ import annotations

import functools
import zoneinfo
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from sendqueue.domain.errors import InfrastructureError, InvalidField, NotFound
from sendqueue.domain.lifecycle import CampaignState, StopOnReply, TaskOutcome, TaskState
from sendqueue.domain.models import Campaign, DeadLetter
from sendqueue.domain.policy import WEEKDAY_NAMES
from sendqueue.domain.reads import CampaignFigures
from sendqueue.domain.steps import MAX_STEPS
from sendqueue.domain.suppression import SuppressionReason
from sendqueue.services.reading.queries import Queries, senders_of
from sendqueue.services.reading.views import DeadLetterView, SuppressionView, iso
from sendqueue.services.senders.service import SenderService
from sendqueue.web.charts import day_chart, progress_segments, usage_chart
from sendqueue.web.deps import (
    ClockDep,
    DeadLettersDep,
    MailboxesDep,
    QueriesDep,
    SendersDep,
    SettingsDep,
    SuppressionDep,
    WebhooksDep,
)
from sendqueue.web.queries import sender_detail, sender_out
from sendqueue.web.rendering import error_page, render
from sendqueue.web.steps_view import funnel_rows
from sendqueue.web.task_rows import task_details, task_row
from sendqueue.web.times import human_time
from sendqueue.web.webhook_rows import (
    delivery_page,
    endpoint_row,
    endpoint_rows,
    event_types,
)

__all__ = ["PAGE_SIZE", "router"]

#: Rows of the task table per page; the scripts ask the API for the same.
PAGE_SIZE = 50
_SEARCH_MAX = 200

router = APIRouter(include_in_schema=False)

_FINAL_STATES = (TaskState.FINISHED, TaskState.FAILED, TaskState.CANCELLED)
# Which controls a campaign state offers; campaign.js keeps the same table.
_ACTIONS: dict[str, frozenset[CampaignState]] = {
    "provision": frozenset({CampaignState.DRAFT}),
    "pause": frozenset({CampaignState.ACTIVE}),
    "resume": frozenset({CampaignState.PAUSED}),
    "retry-failed": frozenset(
        {CampaignState.ACTIVE, CampaignState.PAUSED, CampaignState.COMPLETED}
    ),
    "cancel": frozenset(
        {
            CampaignState.DRAFT,
            CampaignState.PROVISIONING,
            CampaignState.ACTIVE,
            CampaignState.PAUSED,
        }
    ),
}
# What a page shows instead of its data when an id is unknown, a parameter is bad or the
# store does not answer.
_PAGE_ERRORS = (NotFound, InvalidField, InfrastructureError)


def _total(campaign: Campaign, counts: Mapping[TaskState, int]) -> int:
    return max(campaign.recipient_count, sum(counts.values()))


# What the list and the campaign page say of a campaign's stop-on-reply option.
STOP_ON_REPLY_TEXT = {
    StopOnReply.SENDER: "every campaign from this sender",
    StopOnReply.CAMPAIGN: "this campaign only",
    StopOnReply.OFF: "off (a reply is only recorded)",
}


def outcomes_text(outcomes: Mapping[str, int]) -> str:
    """``"2 bounced, 1 replied"``: the outcomes other than accepted that some email has, or
    "" (campaigns.js writes the same)."""
    return ", ".join(
        f"{outcomes.get(o.value, 0)} {o.value}"
        for o in TaskOutcome
        if o is not TaskOutcome.ACCEPTED and outcomes.get(o.value, 0)
    )


def _summary(figures: CampaignFigures) -> dict[str, Any]:
    """What the list and the campaign page show about one campaign."""
    campaign, counts = figures.campaign, figures.counts
    by_name = {state.value: counts.get(state, 0) for state in TaskState}
    found = figures.outcomes
    outcomes = {outcome.value: found.get(outcome, 0) for outcome in TaskOutcome}
    total = _total(campaign, counts)
    final = sum(counts.get(s, 0) for s in _FINAL_STATES)
    zone = campaign.policy.zone
    next_send = figures.next_send_at
    return {
        "campaign": campaign,
        "counts": by_name,
        "outcomes": outcomes,
        "outcomes_text": outcomes_text(outcomes),
        "total": total,
        "final": final,
        "percent": final * 100 // total if total else 0,
        "segments": progress_segments(by_name, total),
        "next_send": human_time(next_send, zone),
        "next_send_iso": iso(next_send) or "",
        "policy_text": campaign.policy.describe(local_time=campaign.local_time),
    }


@router.get("/", response_class=HTMLResponse, name="page_campaigns")
def campaigns_page(request: Request, queries: QueriesDep, settings: SettingsDep) -> Response:
    """Every campaign with its state, progress, counts and next send: one store read."""
    try:
        rows = [_summary(figures) for figures in queries.campaigns()]
        return render(
            request,
            "campaigns.html",
            title="Campaigns",
            rows=rows,
            states=list(TaskState),
            poll_ms=round(settings.ui_poll_interval * 1000),
            zones=[row["campaign"].policy.timezone for row in rows],
        )
    except _PAGE_ERRORS as exc:
        return error_page(request, exc)


@router.get("/campaigns", name="page_campaigns_alias")
def campaigns_alias(request: Request) -> Response:
    """``/campaigns`` is the list at ``/`` (a link or a login's ``next`` may name it)."""
    query = request.url.query
    return RedirectResponse("/" + (f"?{query}" if query else ""), status_code=303)


@router.get("/campaigns/new", response_class=HTMLResponse, name="page_new_campaign")
def new_campaign_page(request: Request, settings: SettingsDep, senders: SendersDep) -> Response:
    """The form that uploads a CSV, sets the policy, previews the plan and creates a draft."""
    return render(
        request,
        "new.html",
        title="New campaign",
        default_timezone=settings.default_timezone,
        default_from=settings.default_from,
        timezones=_timezones(),
        weekdays=WEEKDAY_NAMES,
        stop_on_reply=[(scope.value, STOP_ON_REPLY_TEXT[scope]) for scope in StopOnReply],
        max_upload_mb=max(1, settings.max_upload_bytes // (1024 * 1024)),
        empty_chart=day_chart([]),
        senders=_sender_choices(senders),
        step_slots=range(2, MAX_STEPS + 1),
    )


def _sender_choices(senders: SenderService) -> list[dict[str, Any]] | None:
    """The senders the form offers (their masked views); None when the store does not answer,
    so the form still works for a campaign sent from its From."""
    try:
        return [sender_out(s).model_dump() for s in senders.all()]
    except InfrastructureError:
        return None


@functools.cache
def _timezones() -> list[str]:
    return sorted(z for z in zoneinfo.available_timezones() if "/" in z or z == "UTC")


def _int_param(value: str | None, default: int) -> int:
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        return default


@router.get("/campaigns/{campaign_id}", response_class=HTMLResponse, name="page_campaign")
def campaign_page(
    request: Request,
    campaign_id: str,
    queries: QueriesDep,
    settings: SettingsDep,
    state: str | None = None,
    search: str | None = None,
    after: str | None = None,
) -> Response:
    """One campaign: policy, counts, timeline, actions and the paged task table; one store
    read while the timeline kept is current."""
    try:
        wanted = TaskState.parse(state) if state and state.strip() else None
        needle = (search or "").strip()[:_SEARCH_MAX] or None
        cursor = max(-1, _int_param(after, -1))
        # the page's stream resumes after its last_change_id, read before the rest, so a
        # change made while this page renders arrives as an event instead of falling into a gap
        read, tally = queries.campaign_page(
            campaign_id, state=wanted, search=needle, after=cursor, limit=PAGE_SIZE
        )
        figures, listing = read.figures, read.listing
        campaign = figures.campaign
        summary = _summary(figures)
        paused = campaign.state is CampaignState.PAUSED
        senders = senders_of(listing)
        page = listing.tasks
        return render(
            request,
            "campaign.html",
            title=campaign.name,
            last_change=read.last_change_id,
            zones=[campaign.policy.timezone],
            tasks=[
                task_row(t, campaign, campaign_paused=paused, sender=senders.of(t)) for t in page
            ],
            campaign_senders=[s.shown for s in senders.campaign_senders()],
            moved=figures.moved,
            late=figures.late,
            suppressed=figures.suppressed,
            stop_on_reply_text=STOP_ON_REPLY_TEXT[campaign.stop_on_reply],
            outcome_names=[o.value for o in TaskOutcome],
            next_cursor=page[-1].position if listing.more and page else None,
            cursor=cursor,
            filter_state=wanted.value if wanted else "",
            search=needle or "",
            chart=day_chart(tally.timeline),
            sequence=len(campaign.steps) > 1,
            funnel=funnel_rows(campaign, tally.steps),
            actions=_actions(campaign, summary["counts"]),
            states=list(TaskState),
            page_size=PAGE_SIZE,
            refetch_ms=round(settings.ui_refetch_interval * 1000),
            poll_ms=round(settings.ui_poll_interval * 1000),
            **summary,
        )
    except _PAGE_ERRORS as exc:
        return error_page(request, exc)


def _actions(campaign: Campaign, counts: Mapping[str, int]) -> dict[str, bool]:
    """Which controls the campaign offers now (retrying needs a Failed email)."""
    offered = {name: campaign.state in allowed for name, allowed in _ACTIONS.items()}
    offered["retry-failed"] = offered["retry-failed"] and counts.get(TaskState.FAILED.value, 0) > 0
    return offered


@router.get(
    "/campaigns/{campaign_id}/emails/{task_id}", response_class=HTMLResponse, name="page_email"
)
def email_page(request: Request, campaign_id: str, task_id: str, queries: QueriesDep) -> Response:
    """One email with every field: state and why, outcome, sender, times, message id, moves,
    and the message itself."""
    try:
        campaign, task, sender = queries.email(campaign_id, task_id)
        paused = campaign.state is CampaignState.PAUSED
        email = task_details(task, campaign, campaign_paused=paused, sender=sender)
        return render(
            request,
            "email.html",
            title=f"Email to {task.email}",
            campaign=campaign,
            email=email,
            zones=[campaign.policy.timezone],
        )
    except _PAGE_ERRORS as exc:
        return error_page(request, exc)


def _letter_row(letter: DeadLetter, zone: str) -> dict[str, Any]:
    """The letter's view, its payload as one line of text, its time as people read it."""
    view = DeadLetterView.of(letter)
    row = view.model_dump()
    row.update(
        payload=", ".join(f"{k}={v}" for k, v in sorted(view.payload.items())),
        task_id=view.payload.get("task_id", ""),
        failed_at_text=human_time(letter.failed_at, zone),
    )
    return row


@router.get("/dead-letters", response_class=HTMLResponse, name="page_dead_letters")
def dead_letters_page(
    request: Request, dead_letters: DeadLettersDep, settings: SettingsDep
) -> Response:
    """Invocations the execution layer gave up on, each with a redrive button."""
    try:
        letters = dead_letters.letters()
        return render(
            request,
            "dead_letters.html",
            title="Dead letters",
            letters=[_letter_row(d, settings.default_timezone) for d in letters],
        )
    except _PAGE_ERRORS as exc:
        return error_page(request, exc)


@router.get("/suppressions", response_class=HTMLResponse, name="page_suppressions")
def suppressions_page(
    request: Request,
    suppression: SuppressionDep,
    settings: SettingsDep,
    after: str | None = None,
) -> Response:
    """The suppression list, a page at a time, with an add form and a remove button each."""
    try:
        cursor = (after or "").strip()[:320] or None
        page = suppression.page(after=cursor, limit=PAGE_SIZE + 1)
        more = len(page) > PAGE_SIZE
        page = page[:PAGE_SIZE]
        return render(
            request,
            "suppressions.html",
            title="Suppression list",
            entries=[
                {
                    **SuppressionView.of(e).model_dump(),
                    "at_text": human_time(e.at, settings.default_timezone),
                }
                for e in page
            ],
            total=suppression.count(),
            cursor=cursor,
            next_cursor=page[-1].email if more and page else None,
            reasons=[r.value for r in SuppressionReason],
        )
    except _PAGE_ERRORS as exc:
        return error_page(request, exc)


@router.get("/senders", response_class=HTMLResponse, name="page_senders")
def senders_page(
    request: Request,
    senders: SendersDep,
    mailboxes: MailboxesDep,
    settings: SettingsDep,
    added: str | None = None,
) -> Response:
    """Every sender with its usage against its cap over the coming days (a chart and the same
    numbers as a table), a form to add one and a remove button each."""
    try:
        details = [sender_detail(senders, sender, mailboxes=mailboxes) for sender in senders.all()]
        rows: list[dict[str, Any]] = []
        for detail in details:
            usage = [d.model_dump() for d in detail.usage]
            polled = detail.mailbox.polled_at if detail.mailbox else None
            rows.append(
                {
                    "sender": detail,
                    "usage": usage,
                    "chart": usage_chart(usage),
                    # the mailbox's last pass, on the sender's own wall clock
                    "polled": human_time(datetime.fromisoformat(polled), detail.timezone)
                    if polled
                    else "",
                }
            )
        just_added = next((d for d in details if added and d.id == added), None)
        return render(
            request,
            "senders.html",
            title="Senders",
            rows=rows,
            added=just_added,
            default_timezone=settings.default_timezone,
            timezones=_timezones(),
        )
    except _PAGE_ERRORS as exc:
        return error_page(request, exc)


def _campaign_choices(queries: Queries) -> list[dict[str, str]]:
    """The campaigns a webhook's filter offers, by name."""
    found = sorted(queries.all_campaigns(), key=lambda campaign: (campaign.name, campaign.id))
    return [{"id": campaign.id, "name": campaign.name} for campaign in found]


@router.get("/webhooks", response_class=HTMLResponse, name="page_webhooks")
def webhooks_page(
    request: Request, webhooks: WebhooksDep, queries: QueriesDep, settings: SettingsDep
) -> Response:
    """Every webhook endpoint with its filters, state and last delivery, a form to add one;
    each one's controls (filters, enable/disable, rotate its secret, remove)."""
    try:
        zone = settings.default_timezone
        return render(
            request,
            "webhooks.html",
            title="Webhooks",
            rows=endpoint_rows(webhooks, zone),
            log=None,
            event_types=event_types(),
            campaigns=_campaign_choices(queries),
            poll_ms=round(settings.ui_poll_interval * 1000),
        )
    except _PAGE_ERRORS as exc:
        return error_page(request, exc)


@router.get("/webhooks/{endpoint_id}", response_class=HTMLResponse, name="page_webhook")
def webhook_page(
    request: Request,
    endpoint_id: str,
    webhooks: WebhooksDep,
    queries: QueriesDep,
    settings: SettingsDep,
    clock: ClockDep,
    before: str | None = None,
) -> Response:
    """One endpoint with its controls and its delivery log of the last 7 days, a page at a
    time (``before``: the cursor of "Older attempts"), with "Redeliver" for one event or every
    failed one. A cursor not of this log is the 400 page."""
    try:
        zone = settings.default_timezone
        view = webhooks.get(endpoint_id)
        log = delivery_page(webhooks, view.id, before or None, clock.now(), zone)
        return render(
            request,
            "webhooks.html",
            title=f"Webhook {view.url}",
            rows=[endpoint_row(webhooks, view, zone)],
            log=log,
            event_types=event_types(),
            campaigns=_campaign_choices(queries),
            poll_ms=round(settings.ui_poll_interval * 1000),
        )
    except _PAGE_ERRORS as exc:
        return error_page(request, exc)
