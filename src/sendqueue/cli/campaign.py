"""``sendqueue campaign``: create, inspect and control campaigns."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from sendqueue.bootstrap import Container, import_limits
from sendqueue.cli.campaign_steps import StepsOpt, print_steps, read_steps
from sendqueue.cli.common import (
    JitterOpt,
    JsonOpt,
    PerDayOpt,
    SeedOpt,
    SkipOpt,
    TimezoneOpt,
    WeekdaysOpt,
    WindowOpt,
    build_policy,
    container,
    handle_errors,
    out,
    print_json,
)
from sendqueue.cli.render import (
    plan_rows,
    print_plan,
    print_provision,
    print_step_load,
    print_zones,
    provision_with_progress,
    step_rows,
    zone_rows,
)
from sendqueue.domain.errors import InvalidField, NotFound
from sendqueue.domain.lifecycle import CampaignState, TaskOutcome, TaskState
from sendqueue.domain.models import Campaign, check_cursor
from sendqueue.domain.planner import per_zone_day_summary
from sendqueue.domain.steps import MAX_STEPS
from sendqueue.domain.wording import plural
from sendqueue.services.campaigns.preview import STEPS_NOTE, ZoneDays, sequence_loads
from sendqueue.services.importing.recipients import Templates
from sendqueue.services.reading.queries import campaign_json, senders_of
from sendqueue.services.reading.views import task_list_dict

__all__ = ["campaign_app"]

campaign_app = typer.Typer(help="Create, inspect and control campaigns.", no_args_is_help=True)


# The options only `campaign create` takes.
RecipientsOpt = Annotated[
    Path, typer.Option("--recipients", help="CSV file: email, name, subject, body, html, ...")
]
StartOpt = Annotated[
    str | None, typer.Option("--start", help="Earliest send, ISO-8601 [default: provisioning]")
]
FromOpt = Annotated[
    str | None, typer.Option("--from", help="From address [default: SENDQUEUE_DEFAULT_FROM]")
]
ReplyToOpt = Annotated[str | None, typer.Option("--reply-to", help="Reply-To address.")]
SubjectOpt = Annotated[
    str | None, typer.Option("--subject", help="Subject template (Jinja2, {{ name }} ...).")
]
BodyFileOpt = Annotated[Path | None, typer.Option("--body-file", help="Text body template file.")]
HtmlFileOpt = Annotated[Path | None, typer.Option("--html-file", help="HTML body template file.")]
StopOnReplyOpt = Annotated[
    str,
    typer.Option(
        "--stop-on-reply",
        help="When a recipient replies, cancel their unsent emails in every active campaign "
        "of this sender (sender), in this campaign only (campaign), or none (off).",
    ),
]
FooterOpt = Annotated[
    bool,
    typer.Option(
        "--unsubscribe-footer/--no-unsubscribe-footer",
        help="Add a one-line unsubscribe footer to every email.",
    ),
]
SenderOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--sender",
        help="A sender (id or address, see `sendqueue sender list`) to spread the emails "
        "across, within its daily cap (repeatable) [default: --from sends, no cap]",
    ),
]
LocalTimeOpt = Annotated[
    bool,
    typer.Option(
        "--local-time",
        help="Read the windows in each recipient's own timezone (the CSV's 'timezone' "
        "column; the campaign's zone where it is empty).",
    ),
]


@campaign_app.command("create")
@handle_errors
def campaign_create(
    name: Annotated[str, typer.Option("--name", help="Campaign name.")],
    recipients: RecipientsOpt,
    timezone: TimezoneOpt = None,
    per_day: PerDayOpt = 20,
    weekdays: WeekdaysOpt = "mon-fri",
    window: WindowOpt = None,
    start: StartOpt = None,
    skip_date: SkipOpt = None,
    jitter: JitterOpt = 0,
    seed: SeedOpt = 0,
    from_addr: FromOpt = None,
    reply_to: ReplyToOpt = None,
    subject: SubjectOpt = None,
    body_file: BodyFileOpt = None,
    html_file: HtmlFileOpt = None,
    stop_on_reply: StopOnReplyOpt = "sender",
    unsubscribe_footer: FooterOpt = False,
    sender: SenderOpt = None,
    local_time: LocalTimeOpt = False,
    steps_file: StepsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Import a CSV of recipients as a new draft campaign (all or nothing); with --steps, a
    sequence."""
    if not recipients.is_file():
        raise InvalidField("recipients", str(recipients), "no such file")
    templates = Templates(
        subject=subject,
        body=_read_text(body_file, "body_file") if body_file else None,
        html=_read_text(html_file, "html_file") if html_file else None,
    )
    with container() as c:
        policy = build_policy(
            timezone=timezone,
            per_day=per_day,
            weekdays=weekdays,
            windows=window,
            start=start,
            skip_dates=skip_date,
            jitter=jitter,
            seed=seed,
            default_timezone=c.settings.default_timezone,
        )
        limits = import_limits(c.settings)
        steps, templates = read_steps(steps_file, templates, limits.templates)
        created = c.campaign_import.create(
            name=name,
            recipients=recipients,
            policy=policy,
            from_addr=from_addr,
            reply_to=reply_to,
            templates=templates,
            limits=limits,
            stop_on_reply=stop_on_reply,
            unsubscribe_footer=unsubscribe_footer,
            senders=sender or (),
            local_time=local_time,
            steps=steps,
        )
        campaign = created.campaign
        data = campaign_json(c.queries.figures_for(campaign, steps=True))
        data["import"] = {"rows": created.imported.rows, "duplicates": created.imported.duplicates}
        if as_json:
            print_json(data)
            return
        _print_created(c, campaign, created.imported.duplicates, data)


def _print_created(c: Container, campaign: Campaign, duplicates: int, data: dict[str, Any]) -> None:
    """What ``campaign create`` prints of the campaign it made, and what to do next."""
    out.print(
        f"created campaign [bold]{campaign.id}[/] ({campaign.name}): "
        f"{plural(campaign.recipient_count, 'recipient')}, "
        f"{plural(duplicates, 'duplicate')} dropped"
    )
    out.print(f"policy: {campaign.policy.describe(local_time=campaign.local_time)}")
    out.print(_options_line(data))
    out.print(_senders_line(c, data), markup=False)
    if len(data["steps"]) > 1:
        print_steps(data["steps"], counts=False)
    out.print(
        f"next: sendqueue campaign preview {campaign.id}  |  "
        f"sendqueue campaign provision {campaign.id}"
    )


def _options_line(data: dict[str, Any]) -> str:
    """The campaign's feedback options as ``campaign create`` and ``show`` print them."""
    footer = "on" if data["unsubscribe_footer"] else "off"
    return f"stop on reply: {data['stop_on_reply']}  unsubscribe footer: {footer}"


def _senders_line(c: Container, data: dict[str, Any]) -> str:
    """``senders: a@example.com, b@example.com  local time: off`` (an id whose sender was
    removed since is shown as it is)."""
    addresses = []
    for sender_id in data["senders"]:
        try:
            addresses.append(c.senders.get(sender_id).email)
        except NotFound:
            addresses.append(f"{sender_id} (removed)")
    senders = ", ".join(addresses) or f"none ({data['from']} sends)"
    return f"senders: {senders}  local time: {'on' if data['local_time'] else 'off'}"


def _outcomes_line(outcomes: dict[str, int]) -> str:
    """``accepted: 40  bounced: 2 ...``: the sent emails per outcome."""
    return "outcomes: " + "  ".join(f"{k}: {v}" for k, v in outcomes.items())


def _read_text(path: Path, field: str) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidField(field, str(path), f"cannot read it: {exc}") from exc


@campaign_app.command("list")
@handle_errors
def campaign_list(as_json: JsonOpt = False) -> None:
    """All campaigns with their state and counts."""
    with container() as c:
        rows = [campaign_json(figures) for figures in c.queries.campaigns()]
    if as_json:
        print_json(rows)
        return
    table = Table(title=plural(len(rows), "campaign"))
    # the outcomes other than accepted: what came back after sending
    feedback = [o.value for o in TaskOutcome if o is not TaskOutcome.ACCEPTED]
    for col in ("id", "name", "state", "recipients", *[s.value for s in TaskState], *feedback):
        numeric = col[0].isupper() or col == "recipients" or col in feedback
        table.add_column(col, justify="right" if numeric else "left")
    for r in rows:
        table.add_row(
            r["id"],
            r["name"],
            r["state"],
            str(r["recipients"]),
            *[str(r["counts"][s.value]) for s in TaskState],
            *[str(r["outcomes"][name]) for name in feedback],
        )
    out.print(table)


@campaign_app.command("show")
@handle_errors
def campaign_show(campaign_id: str, as_json: JsonOpt = False) -> None:
    """One campaign: policy, state, counts per task state and its steps with theirs."""
    with container() as c:
        data = campaign_json(c.queries.campaign(campaign_id, steps=True))
        senders = _senders_line(c, data)
    if as_json:
        print_json(data)
        return
    out.print(f"[bold]{data['name']}[/] ({data['id']}) is [bold]{data['state']}[/]")
    if data["state_reason"]:
        out.print(f"reason: {data['state_reason']}", markup=False)
    out.print(f"policy: {data['policy_text']}", markup=False)
    out.print(
        f"from: {data['from']}" + (f"  reply-to: {data['reply_to']}" if data["reply_to"] else ""),
        markup=False,
    )
    out.print(f"recipients: {data['recipients']}")
    out.print("  ".join(f"{k}: {v}" for k, v in data["counts"].items()))
    if data["suppressed"]:
        out.print(f"suppressed: {data['suppressed']} (cancelled: on the suppression list)")
    out.print(_outcomes_line(data["outcomes"]))
    out.print(_options_line(data))
    out.print(senders, markup=False)
    print_steps(data["steps"])


@campaign_app.command("preview")
@handle_errors
def campaign_preview(campaign_id: str, as_json: JsonOpt = False) -> None:
    """The plan for the campaign's recipients if it were provisioned now, in time order."""
    with container() as c:
        campaign = c.queries.campaign_of(campaign_id)
        # in time order (senders and recipient zones interleave the recipients), equal
        # instants in recipient order
        pairs = sorted(c.campaign_previews.preview(campaign_id), key=lambda pair: pair[1])
    default = campaign.policy.timezone
    sends = [when for _, when in pairs]
    # the zone each send's windows are read in: its recipient's in a local-time campaign
    own = [(r.timezone or default) if campaign.local_time else default for r, _ in pairs]
    zones = tuple(
        ZoneDays(zone, tuple(days), sum(d.count for d in days))
        for zone, days in per_zone_day_summary(
            sends, [z if campaign.local_time else None for z in own], default
        ).items()
    )
    emails = [r.email for r, _ in pairs]
    loads = sequence_loads(
        campaign, sends, [r.timezone for r, _ in pairs] if campaign.local_time else None
    )
    if as_json:
        rows = plan_rows(sends, default)
        for row, (recipient, _), zone in zip(rows, pairs, own, strict=True):
            row.update(email=recipient.email, position=recipient.position, zone=zone)
        data: dict[str, Any] = {"timezone": default, "sends": rows, "zones": zone_rows(zones)}
        if loads:
            data.update(steps=step_rows(loads), steps_note=STEPS_NOTE)
        print_json(data)
        return
    text = campaign.policy.describe(local_time=campaign.local_time)
    out.print(f"{campaign.name}: {text}", markup=False)
    print_plan(sends, default, emails=emails, zones=own if campaign.local_time else None)
    if campaign.local_time or len(zones) > 1:
        print_zones(zones)
    if loads:
        print_step_load(loads, default)
        out.print(STEPS_NOTE, markup=False)


@campaign_app.command("provision")
@handle_errors
def campaign_provision(
    campaign_id: str,
    time_budget: Annotated[
        float | None,
        typer.Option(
            "--time-budget", help="Stop after this many seconds and continue in the worker."
        ),
    ] = None,
    safety_margin: Annotated[
        float, typer.Option("--safety-margin", help="Seconds kept in reserve from the budget.")
    ] = 90.0,
    as_json: JsonOpt = False,
) -> None:
    """Create every task and schedule (resumable; running it twice creates nothing twice)."""
    with container() as c:
        if as_json:
            report = c.provisioner.provision(
                campaign_id, time_budget=time_budget, safety_margin=safety_margin
            )
        else:
            report = provision_with_progress(c, campaign_id, time_budget, safety_margin)
        data = {
            "campaign_id": report.campaign_id,
            "status": report.status,
            "total": report.total,
            "tasks_created": report.tasks_created,
            "schedules_created": report.schedules_created,
            "throttled": report.throttled,
            "suppressed": report.suppressed,
            "errors": report.errors,
            "seconds": round(report.seconds, 3),
        }
        if as_json:
            print_json(data)
        else:
            print_provision(report)
        if report.status in {"stopped", "busy"}:
            raise typer.Exit(3 if report.status == "stopped" else 1)


def _control(name: str, call: Callable[[Container, str], Any]) -> Callable[..., None]:
    @handle_errors
    def command(campaign_id: str, as_json: JsonOpt = False) -> None:
        with container() as c:
            result = call(c, campaign_id)
            data = campaign_json(c.queries.campaign(campaign_id))
        if isinstance(result, int):
            data["affected"] = result
        if as_json:
            print_json(data)
        else:
            extra = f" ({plural(result, 'email')})" if isinstance(result, int) else ""
            out.print(f"{campaign_id}: {name} done{extra}; campaign is {data['state']}")

    command.__name__ = f"campaign_{name.replace('-', '_')}"
    return command


campaign_app.command("cancel", help="Cancel every Pending email and delete the schedules.")(
    _control("cancel", lambda c, i: c.campaign_controls.cancel(i))
)
campaign_app.command("pause", help="Delete the schedules of Pending emails; they stay Pending.")(
    _control("pause", lambda c, i: c.campaign_controls.pause(i))
)
campaign_app.command("resume", help="Re-plan the Pending emails from now and schedule them.")(
    _control("resume", lambda c, i: c.campaign_controls.resume(i))
)
campaign_app.command("retry-failed", help="Send the Failed emails again, re-planned from now.")(
    _control("retry-failed", lambda c, i: c.campaign_controls.retry_failed(i))
)


@campaign_app.command("tasks")
@handle_errors
def campaign_tasks(
    campaign_id: str,
    state: Annotated[str | None, typer.Option("--state", help="Only this state.")] = None,
    search: Annotated[str | None, typer.Option("--search", help="Address contains.")] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many (0 = all).")] = 0,
    after: Annotated[int, typer.Option("--after", help="Cursor: position to start after.")] = -1,
    step: Annotated[int | None, typer.Option("--step", help="Only this step's (1: first).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The campaign's emails in position order."""
    wanted = TaskState.parse(state) if state is not None else None
    check_cursor(after)
    if step is not None and not 1 <= step <= MAX_STEPS:
        raise InvalidField("step", step, f"a step number, 1 to {MAX_STEPS}")
    if limit < 0:
        raise InvalidField("limit", limit, "must be 0 (all) or more")
    rows: list[dict[str, Any]] = []
    with container() as c:
        cursor = after
        while True:
            page = min(1000, limit - len(rows)) if limit else 1000
            listing = c.queries.recipient_tasks(
                campaign_id, state=wanted, search=search, after=cursor, limit=page, step=step
            )
            campaign, batch, senders = listing.campaign, listing.tasks, senders_of(listing)
            # a paused campaign's Pending emails have no send time until it resumes
            paused = campaign.state is CampaignState.PAUSED
            rows.extend(
                task_list_dict(
                    t, campaign_paused=paused, from_addr=campaign.from_addr, sender=senders.of(t)
                )
                for t in batch
            )
            if not listing.more or not batch or (limit and len(rows) >= limit):
                break
            cursor = batch[-1].position
    rows = rows[:limit] if limit else rows
    if as_json:
        print_json(rows)
        return
    table = Table(title=plural(len(rows), "email"))
    # a step column for a sequence's emails; a campaign of one email keeps its width
    steps = step is not None or len(campaign.steps) > 1 or any(r["step"] > 1 for r in rows)
    columns = (
        "id", *(["step"] if steps else []), "email", "sender", "state", "send_at", "sent_at",
        "outcome", "attempts", "moves", "error/reason",
    )  # fmt: skip
    for col in columns:
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["id"],
            *([str(r["step"])] if steps else []),
            r["email"],
            r["sender"] or "",
            r["state"],
            "paused" if r["paused"] else r["send_at"] or "",
            (r["sent_at"] or "") + (" (late)" if r["late"] else ""),
            r["outcome"] or "",
            str(r["attempts"]),
            f"{r['moves']}: {r['moved_reason']}" if r["moves"] else "",
            (r["error"] or r["reason"] or "")[:60],
        )
    out.print(table)
