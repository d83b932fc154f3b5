"""``sendqueue webhook``: endpoints that receive signed events (docs/webhooks.md).

The signing secret is printed twice only: by ``add`` and by ``rotate-secret``; every other
output shows it masked (``whsec_***`` and its last 4 characters), as the API does.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from sendqueue.cli.common import (
    JsonOpt,
    container,
    given_config,
    handle_errors,
    out,
    print_json,
)
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.models import utc
from sendqueue.domain.webhooks import EventType
from sendqueue.domain.wording import plural
from sendqueue.services.reading.views import iso
from sendqueue.services.webhooks import DeliveryView, WebhookCreated, WebhookView

__all__ = ["delivery_dict", "webhook_app", "webhook_dict"]

webhook_app = typer.Typer(
    help="Webhooks: endpoints that receive signed events (email.sent, email.bounced, "
    "campaign.completed, ...), in order and at least once.",
    no_args_is_help=True,
)

IdArg = Annotated[str, typer.Argument(help="The endpoint's id (wh_...).")]
_TYPES = ", ".join(t.value for t in EventType)
EventOpt = Annotated[
    list[str] | None,
    typer.Option("--event", help=f"An event type it receives (repeatable; none: all): {_TYPES}"),
]
CampaignOpt = Annotated[
    list[str] | None,
    typer.Option("--campaign", help="A campaign id it hears about (repeatable; none: all)."),
]
_TIMES = ("created_at", "previous_secret_expires_at", "retry_at", "failing_since", "at")


def webhook_dict(view: WebhookView) -> dict[str, Any]:
    """An endpoint as ``--json`` prints it (the secret masked)."""
    data = asdict(view)
    return {k: iso(v) if k in _TIMES else v for k, v in data.items()}


def delivery_dict(view: DeliveryView) -> dict[str, Any]:
    """One delivery attempt as ``--json`` prints it."""
    return {k: iso(v) if k in _TIMES else v for k, v in asdict(view).items()}


def _print_created(made: WebhookCreated, as_json: bool, verb: str) -> None:
    if as_json:
        print_json({**webhook_dict(made.endpoint), "signing_secret": made.secret})
        return
    out.print(f"{verb} webhook {made.endpoint.id} -> {made.endpoint.url}", markup=False)
    out.print(f"signing secret (shown once): {made.secret}", markup=False)


def _state(view: WebhookView) -> str:
    if not view.enabled:
        return f"disabled: {view.disabled_reason or ''}"
    if view.attempts:
        return f"failing ({plural(view.attempts, 'attempt')}), retry {iso(view.retry_at)}"
    return "enabled"


@webhook_app.command("add")
@handle_errors
def webhook_add(
    url: Annotated[str, typer.Option("--url", help="https:// (http:// outside production).")],
    event: EventOpt = None,
    campaign: CampaignOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Add an endpoint; prints its id and signing secret (shown this once)."""
    with container() as c:
        made = c.webhooks.add(url, events=event or (), campaigns=campaign or ())
    _print_created(made, as_json, "added")


@webhook_app.command("list")
@handle_errors
def webhook_list(as_json: JsonOpt = False) -> None:
    """Every endpoint, oldest first."""
    with container() as c:
        views = c.webhooks.list()
    if as_json:
        print_json([webhook_dict(v) for v in views])
        return
    table = Table(title=plural(len(views), "webhook"))
    for col in ("id", "url", "events", "campaigns", "state", "delivered up to"):
        table.add_column(col)
    for v in views:
        cells = (
            v.id,
            v.url,
            ", ".join(v.event_types) or "all",
            ", ".join(v.campaign_ids) or "all",
            _state(v),
            str(v.cursor),
        )
        table.add_row(*(Text(cell) for cell in cells))
    out.print(table)


@webhook_app.command("show")
@handle_errors
def webhook_show(endpoint_id: IdArg, as_json: JsonOpt = False) -> None:
    """One endpoint with its delivery state."""
    with container() as c:
        view = c.webhooks.get(endpoint_id)
    if as_json:
        print_json(webhook_dict(view))
        return
    for key, value in webhook_dict(view).items():
        shown = ", ".join(value) if isinstance(value, list) else value
        out.print(f"{key}: {shown if shown not in (None, '') else '-'}", markup=False)


@webhook_app.command("update")
@handle_errors
def webhook_update(
    endpoint_id: IdArg,
    url: Annotated[str | None, typer.Option("--url", help="A new URL.")] = None,
    event: EventOpt = None,
    all_events: Annotated[bool, typer.Option("--all-events", help="Receive every type.")] = False,
    campaign: CampaignOpt = None,
    all_campaigns: Annotated[
        bool, typer.Option("--all-campaigns", help="Hear about every campaign.")
    ] = False,
    enable: Annotated[
        bool | None,
        typer.Option("--enable/--disable", help="Enable (its missed events follow) or disable."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Change what is given; nothing changes if any option is invalid."""
    if event and all_events:
        raise InvalidField("events", event, "give --event or --all-events, not both")
    if campaign and all_campaigns:
        raise InvalidField("campaigns", campaign, "give --campaign or --all-campaigns, not both")
    events = [] if all_events else event
    campaigns = [] if all_campaigns else campaign
    if url is None and events is None and campaigns is None and enable is None:
        raise InvalidField("options", None, "give at least one thing to change")
    with container() as c:
        view = c.webhooks.update(
            endpoint_id, url=url, events=events, campaigns=campaigns, enabled=enable
        )
    if as_json:
        print_json(webhook_dict(view))
        return
    out.print(f"updated webhook {view.id}: {_state(view)}", markup=False)


@webhook_app.command("remove")
@handle_errors
def webhook_remove(endpoint_id: IdArg, as_json: JsonOpt = False) -> None:
    """Delete an endpoint and its delivery log."""
    with container() as c:
        c.webhooks.remove(endpoint_id)
    if as_json:
        print_json({"removed": endpoint_id})
        return
    out.print(f"removed webhook {endpoint_id}", markup=False)


@webhook_app.command("rotate-secret")
@handle_errors
def webhook_rotate(endpoint_id: IdArg, as_json: JsonOpt = False) -> None:
    """A new signing secret (shown once); the old one signs too for 24 hours."""
    with container() as c:
        made = c.webhooks.rotate_secret(endpoint_id)
    _print_created(made, as_json, "rotated the secret of")


def _since(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return utc(datetime.fromisoformat(value))
    except ValueError:
        raise InvalidField(
            "failed_since", value, "must be an ISO time with its offset, e.g. 2026-12-04T10:00Z"
        ) from None


def _print_deliveries(views: list[DeliveryView], as_json: bool, title: str) -> None:
    if as_json:
        print_json([delivery_dict(v) for v in views])
        return
    table = Table(title=title)
    for col in ("at", "event", "type", "attempt", "result", "ms"):
        table.add_column(col, justify="right" if col in {"attempt", "ms"} else "left")
    for v in views:
        result = f"{v.status or ''} {v.error or 'ok'}".strip()
        if v.redelivery:
            result += " (redelivery)"
        cells = (iso(v.at), v.event_id, v.event_type, str(v.attempt), result, str(v.latency_ms))
        table.add_row(*(Text(cell) for cell in cells))
    out.print(table)


@webhook_app.command("redeliver")
@handle_errors
def webhook_redeliver(
    endpoint_id: IdArg,
    event_ids: Annotated[
        list[str] | None, typer.Argument(help="Event ids to send again (evt_...).")
    ] = None,
    failed_since: Annotated[
        str | None,
        typer.Option("--failed-since", help="Every event failed at or after this ISO time."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Send events again now, with their ids (out of band: the endpoint's order and retries
    are untouched)."""
    with container() as c:
        views = c.webhooks.redeliver(
            endpoint_id, event_ids=event_ids or (), failed_since=_since(failed_since)
        )
    _print_deliveries(views, as_json, f"redelivered {plural(len(views), 'event')}")


@webhook_app.command("deliveries")
@handle_errors
def webhook_deliveries(
    endpoint_id: IdArg,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=1000, help="How many, newest first.")
    ] = 50,
    before: Annotated[
        str | None,
        typer.Option(
            "--before", help="A cursor: the attempts older than it (printed after a page)."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """The endpoint's delivery log, newest first (7 days are kept), a page at a time; the
    command for the next page follows it (--json: its cursor is ``next``)."""
    with container() as c:
        page = c.webhooks.deliveries(endpoint_id, limit=limit, before=before)
    if as_json:
        print_json({"deliveries": [delivery_dict(v) for v in page.deliveries], "next": page.next})
        return
    _print_deliveries(page.deliveries, False, plural(len(page.deliveries), "attempt"))
    if page.next is not None:
        config = given_config()
        args = ["webhook", "deliveries", endpoint_id, "--limit", str(limit), "--before", page.next]
        command = shlex.join(["sendqueue", *(["--config", config] if config else []), *args])
        # never wrapped, so that it can be copied whole
        out.print(f"older attempts: {command}", markup=False, soft_wrap=True)
