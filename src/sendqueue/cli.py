"""The ``sendqueue`` command line (Typer + Rich).

Exit status: 0 success, 1 refused (unknown id, illegal transition, conflict), 2 invalid input
(one line on stderr naming the field; CSV problems as a list of rows), 3 infrastructure failure
(store, scheduler or mailer unreachable).
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.live import Live
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sendqueue import __version__
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.errors import (
    Conflict,
    IllegalTransition,
    InfrastructureError,
    InvalidField,
    InvalidInput,
    NoSendingDay,
    NotFound,
)
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import check_cursor
from sendqueue.domain.planner import per_day_summary, plan
from sendqueue.domain.policy import (
    SendingPolicy,
    Window,
    load_timezone,
    parse_date,
    parse_start,
    parse_weekdays,
    parse_window,
)
from sendqueue.runtime import run_worker
from sendqueue.services.dead_letters import redrive_all
from sendqueue.services.demo import demo_csv, demo_policy
from sendqueue.services.importing import Templates
from sendqueue.services.provisioning import ProvisionProgress, ProvisionReport
from sendqueue.services.views import campaign_dict, dead_letter_dict, iso, task_dict
from sendqueue.settings import Settings, redact_url

__all__ = ["app", "main"]

app = typer.Typer(
    name="sendqueue",
    help="Scheduled email campaigns: one durable task and one schedule per email.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
campaign_app = typer.Typer(help="Create, inspect and control campaigns.", no_args_is_help=True)
task_app = typer.Typer(help="Act on a single email.", no_args_is_help=True)
dlq_app = typer.Typer(help="The dead-letter queue of failed invocations.", no_args_is_help=True)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(campaign_app, name="campaign")
app.add_typer(task_app, name="task")
app.add_typer(dlq_app, name="dlq")
app.add_typer(db_app, name="db")

# Piped output is not squeezed into 80 columns: ids must stay whole for scripts and people.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)
log = logging.getLogger("sendqueue")

F = TypeVar("F", bound=Callable[..., Any])


def _fail(code: int, message: str) -> NoReturn:
    err.print(f"error: {message}", markup=False, soft_wrap=True)
    raise typer.Exit(code)


def _print_invalid_input(exc: InvalidInput) -> None:
    err.print(f"error: {exc.summary}: {exc.total} problem(s)", markup=False)
    for problem in exc.errors:
        where = f"row {problem.row}: " if problem.row is not None else ""
        err.print(f"  {where}{problem.field}: {problem.reason}", markup=False, soft_wrap=True)
    if exc.total > len(exc.errors):
        err.print(f"  ... and {exc.total - len(exc.errors)} more", markup=False)


def handle_errors(func: F) -> F:
    """Map domain and infrastructure errors to one clear line and an exit status."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except InvalidInput as exc:
            _print_invalid_input(exc)
            raise typer.Exit(2) from None
        except InvalidField as exc:
            _fail(2, str(exc))
        except NoSendingDay as exc:
            _fail(2, f"policy: {exc}")
        except (NotFound, IllegalTransition, Conflict) as exc:
            _fail(1, str(exc))
        except InfrastructureError as exc:
            _fail(3, f"{type(exc).__name__}: {exc}")

    return wrapper  # type: ignore[return-value]


@contextmanager
def _container() -> Iterator[Container]:
    try:
        settings = Settings()
    except Exception as exc:  # pydantic's ValidationError: name the variable and the problem
        lines = str(exc).splitlines()
        _fail(2, "invalid settings: " + " ".join(line.strip() for line in lines[:3]))
    container = bootstrap(settings)
    try:
        yield container
    finally:
        container.close()


def _json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


# -- shared policy flags ----------------------------------------------------------------------
TimezoneOpt = Annotated[
    str | None,
    typer.Option("--timezone", help="IANA timezone [default: SENDQUEUE_DEFAULT_TIMEZONE]"),
]
PerDayOpt = Annotated[int, typer.Option("--per-day", help="Emails per local day (1..10000).")]
WeekdaysOpt = Annotated[
    str, typer.Option("--weekdays", help="Sending days: mon,tue,... or ranges like mon-fri.")
]
WindowOpt = Annotated[
    list[str] | None,
    typer.Option("--window", help="Daily window HH:MM-HH:MM (repeatable) [default: 09:00-17:00]"),
]
SkipOpt = Annotated[
    list[str] | None, typer.Option("--skip-date", help="A date to skip, YYYY-MM-DD (repeatable).")
]
JitterOpt = Annotated[int, typer.Option("--jitter", help="Random shift of each send, seconds.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed that makes jitter repeatable.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def build_policy(
    *,
    timezone: str | None,
    per_day: int,
    weekdays: str,
    windows: list[str] | None,
    start: str | None,
    skip_dates: list[str] | None,
    jitter: int,
    seed: int,
    default_timezone: str,
) -> SendingPolicy:
    """A policy from the textual flags; every problem names its flag's field."""
    zone = timezone or default_timezone
    load_timezone(zone)
    return SendingPolicy(
        timezone=zone,
        per_day=per_day,
        weekdays=parse_weekdays(weekdays),
        windows=tuple(parse_window(w) for w in windows) if windows else (Window(540, 1020),),
        start=parse_start(start, zone) if start else None,
        skip_dates=frozenset(parse_date(d) for d in skip_dates or []),
        jitter_seconds=jitter,
        seed=seed,
    )


def _plan_rows(sends: list[datetime], zone_name: str) -> list[dict[str, Any]]:
    zone = load_timezone(zone_name)
    return [
        {"index": i, "send_at": iso(s), "local": s.astimezone(zone).isoformat()}
        for i, s in enumerate(sends)
    ]


def _print_plan(sends: list[datetime], zone_name: str, *, rows: int = 50) -> None:
    zone = load_timezone(zone_name)
    table = Table(title=f"{len(sends)} sends ({zone_name})", show_lines=False)
    table.add_column("#", justify="right")
    table.add_column("send at (UTC)")
    table.add_column(f"local ({zone_name})")
    shown = sends if len(sends) <= rows else sends[: rows - 1]
    for i, s in enumerate(shown):
        table.add_row(str(i), iso(s) or "", s.astimezone(zone).strftime("%a %Y-%m-%d %H:%M:%S %Z"))
    if len(sends) > rows:
        table.add_row("...", f"{len(sends) - len(shown) - 1} more", "")
        last = sends[-1]
        table.add_row(
            str(len(sends) - 1),
            iso(last) or "",
            last.astimezone(zone).strftime("%a %Y-%m-%d %H:%M:%S %Z"),
        )
    out.print(table)
    days = per_day_summary(sends, zone_name)
    summary = Table(title=f"per day: {len(days)} sending day(s)")
    summary.add_column("day")
    summary.add_column("sends", justify="right")
    summary.add_column("first")
    summary.add_column("last")
    for day in days[:60]:
        summary.add_row(
            day.day.strftime("%a %Y-%m-%d"),
            str(day.count),
            day.first.strftime("%H:%M:%S"),
            day.last.strftime("%H:%M:%S"),
        )
    if len(days) > 60:
        summary.add_row(
            "...", f"{sum(d.count for d in days[60:])} in {len(days) - 60} more days", "", ""
        )
    out.print(summary)


# -- commands ---------------------------------------------------------------------------------
@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO level.")] = False,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        out.print(__version__)
        raise typer.Exit(0)
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(console=err, show_path=False, rich_tracebacks=False)],
    )


@app.command("plan")
@handle_errors
def plan_cmd(
    count: Annotated[int, typer.Option("--count", help="How many sends to plan.")] = 20,
    timezone: TimezoneOpt = None,
    per_day: PerDayOpt = 20,
    weekdays: WeekdaysOpt = "mon-fri",
    window: WindowOpt = None,
    start: Annotated[
        str | None, typer.Option("--start", help="ISO-8601 start; no offset = local [default: now]")
    ] = None,
    skip_date: SkipOpt = None,
    jitter: JitterOpt = 0,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Print a plan of send times without touching any store."""
    if count < 0:
        raise InvalidField("count", count, "must be 0 or more")
    policy = build_policy(
        timezone=timezone,
        per_day=per_day,
        weekdays=weekdays,
        windows=window,
        start=start,
        skip_dates=skip_date,
        jitter=jitter,
        seed=seed,
        default_timezone=Settings().default_timezone,
    )
    sends = plan(policy, count, now=None if policy.start else datetime.now(UTC))
    if as_json:
        _json({"timezone": policy.timezone, "sends": _plan_rows(sends, policy.timezone)})
        return
    out.print(policy.describe())
    _print_plan(sends, policy.timezone)


@campaign_app.command("create")
@handle_errors
def campaign_create(
    name: Annotated[str, typer.Option("--name", help="Campaign name.")],
    recipients: Annotated[
        Path, typer.Option("--recipients", help="CSV file: email, name, subject, body, html, ...")
    ],
    timezone: TimezoneOpt = None,
    per_day: PerDayOpt = 20,
    weekdays: WeekdaysOpt = "mon-fri",
    window: WindowOpt = None,
    start: Annotated[
        str | None, typer.Option("--start", help="Earliest send, ISO-8601 [default: provisioning]")
    ] = None,
    skip_date: SkipOpt = None,
    jitter: JitterOpt = 0,
    seed: SeedOpt = 0,
    from_addr: Annotated[
        str | None, typer.Option("--from", help="From address [default: SENDQUEUE_DEFAULT_FROM]")
    ] = None,
    reply_to: Annotated[str | None, typer.Option("--reply-to", help="Reply-To address.")] = None,
    subject: Annotated[
        str | None, typer.Option("--subject", help="Subject template (Jinja2, {{ name }} ...).")
    ] = None,
    body_file: Annotated[
        Path | None, typer.Option("--body-file", help="Text body template file.")
    ] = None,
    html_file: Annotated[
        Path | None, typer.Option("--html-file", help="HTML body template file.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Import a CSV of recipients as a new draft campaign (all or nothing)."""
    if not recipients.is_file():
        raise InvalidField("recipients", str(recipients), "no such file")
    templates = Templates(
        subject=subject,
        body=_read_text(body_file, "body_file") if body_file else None,
        html=_read_text(html_file, "html_file") if html_file else None,
    )
    with _container() as c:
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
        from sendqueue.services.importing import ImportLimits

        limits = ImportLimits(
            max_bytes=c.settings.max_upload_bytes, max_rows=c.settings.max_recipients
        )
        created = c.campaigns.create(
            name=name,
            recipients=recipients,
            policy=policy,
            from_addr=from_addr,
            reply_to=reply_to,
            templates=templates,
            limits=limits,
        )
        campaign = created.campaign
        data = campaign_dict(campaign, c.store.count_tasks(campaign.id))
        data["import"] = {"rows": created.imported.rows, "duplicates": created.imported.duplicates}
        if as_json:
            _json(data)
            return
        out.print(
            f"created campaign [bold]{campaign.id}[/] ({campaign.name}): "
            f"{campaign.recipient_count} recipients, "
            f"{created.imported.duplicates} duplicate(s) dropped"
        )
        out.print(f"policy: {campaign.policy.describe()}")
        out.print(
            f"next: sendqueue campaign preview {campaign.id}  |  "
            f"sendqueue campaign provision {campaign.id}"
        )


def _read_text(path: Path, field: str) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidField(field, str(path), f"cannot read it: {exc}") from exc


@campaign_app.command("list")
@handle_errors
def campaign_list(as_json: JsonOpt = False) -> None:
    """All campaigns with their state and counts."""
    with _container() as c:
        rows = [campaign_dict(x, c.store.count_tasks(x.id)) for x in c.store.list_campaigns()]
    if as_json:
        _json(rows)
        return
    table = Table(title=f"{len(rows)} campaign(s)")
    for col in ("id", "name", "state", "recipients", *[s.value for s in TaskState]):
        table.add_column(
            col, justify="right" if col[0].isupper() or col == "recipients" else "left"
        )
    for r in rows:
        table.add_row(
            r["id"],
            r["name"],
            r["state"],
            str(r["recipients"]),
            *[str(r["counts"][s.value]) for s in TaskState],
        )
    out.print(table)


@campaign_app.command("show")
@handle_errors
def campaign_show(campaign_id: str, as_json: JsonOpt = False) -> None:
    """One campaign: policy, state and counts per task state."""
    with _container() as c:
        data = campaign_dict(c.store.get_campaign(campaign_id), c.store.count_tasks(campaign_id))
    if as_json:
        _json(data)
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


@campaign_app.command("preview")
@handle_errors
def campaign_preview(campaign_id: str, as_json: JsonOpt = False) -> None:
    """The plan for the campaign's recipients if it were provisioned now."""
    with _container() as c:
        campaign = c.store.get_campaign(campaign_id)
        pairs = c.campaigns.preview(campaign_id)
    sends = [when for _, when in pairs]
    if as_json:
        rows = _plan_rows(sends, campaign.policy.timezone)
        for row, (recipient, _) in zip(rows, pairs, strict=True):
            row["email"] = recipient.email
        _json({"timezone": campaign.policy.timezone, "sends": rows})
        return
    out.print(f"{campaign.name}: {campaign.policy.describe()}", markup=False)
    _print_plan(sends, campaign.policy.timezone)


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
    with _container() as c:
        if as_json:
            report = c.provisioner.provision(
                campaign_id, time_budget=time_budget, safety_margin=safety_margin
            )
        else:
            report = _provision_with_progress(c, campaign_id, time_budget, safety_margin)
        data = {
            "campaign_id": report.campaign_id,
            "status": report.status,
            "total": report.total,
            "tasks_created": report.tasks_created,
            "schedules_created": report.schedules_created,
            "throttled": report.throttled,
            "errors": report.errors,
            "seconds": round(report.seconds, 3),
        }
        if as_json:
            _json(data)
        else:
            _print_provision(report)
        if report.status in {"stopped", "busy"}:
            raise typer.Exit(3 if report.status == "stopped" else 1)


def _provision_with_progress(
    c: Container, campaign_id: str, time_budget: float | None, safety_margin: float
) -> ProvisionReport:
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    ) as bar:
        ids: dict[str, Any] = {}

        def progress(p: ProvisionProgress) -> None:
            if p.phase not in ids:
                ids[p.phase] = bar.add_task(p.phase, total=p.total)
            bar.update(ids[p.phase], completed=p.done)

        return c.provisioner.provision(
            campaign_id, time_budget=time_budget, safety_margin=safety_margin, progress=progress
        )


def _print_provision(report: ProvisionReport) -> None:
    messages = {
        "done": "provisioned",
        "continued": "time budget spent; the worker continues from the checkpoint",
        "stopped": "stopped: scheduler calls failed; the checkpoint is kept "
        "(run again, or the reconciler resumes it)",
        "busy": "another process is provisioning this campaign",
    }
    out.print(
        f"{report.campaign_id}: {messages[report.status]} - {report.tasks_created} tasks and "
        f"{report.schedules_created} schedules created of {report.total} in {report.seconds:.1f}s"
        + (f", {report.throttled} throttled call(s) retried" if report.throttled else "")
    )
    for e in report.errors[:10]:
        err.print(f"  {e}", markup=False)


def _control(name: str, call: Callable[[Container, str], Any]) -> Callable[..., None]:
    @handle_errors
    def command(campaign_id: str, as_json: JsonOpt = False) -> None:
        with _container() as c:
            result = call(c, campaign_id)
            data = campaign_dict(
                c.store.get_campaign(campaign_id), c.store.count_tasks(campaign_id)
            )
        if isinstance(result, int):
            data["affected"] = result
        if as_json:
            _json(data)
        else:
            extra = f" ({result} email(s))" if isinstance(result, int) else ""
            out.print(f"{campaign_id}: {name} done{extra}; campaign is {data['state']}")

    command.__name__ = f"campaign_{name.replace('-', '_')}"
    return command


campaign_app.command("cancel", help="Cancel every Pending email and delete the schedules.")(
    _control("cancel", lambda c, i: c.campaigns.cancel(i))
)
campaign_app.command("pause", help="Delete the schedules of Pending emails; they stay Pending.")(
    _control("pause", lambda c, i: c.campaigns.pause(i))
)
campaign_app.command("resume", help="Re-plan the Pending emails from now and schedule them.")(
    _control("resume", lambda c, i: c.campaigns.resume(i))
)
campaign_app.command("retry-failed", help="Send the Failed emails again, re-planned from now.")(
    _control("retry-failed", lambda c, i: c.campaigns.retry_failed(i))
)


@campaign_app.command("tasks")
@handle_errors
def campaign_tasks(
    campaign_id: str,
    state: Annotated[str | None, typer.Option("--state", help="Only this state.")] = None,
    search: Annotated[str | None, typer.Option("--search", help="Address contains.")] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many (0 = all).")] = 0,
    after: Annotated[int, typer.Option("--after", help="Cursor: position to start after.")] = -1,
    as_json: JsonOpt = False,
) -> None:
    """The campaign's emails in position order."""
    wanted = TaskState.parse(state) if state is not None else None
    check_cursor(after)
    if limit < 0:
        raise InvalidField("limit", limit, "must be 0 (all) or more")
    rows: list[dict[str, Any]] = []
    with _container() as c:
        c.store.get_campaign(campaign_id)
        cursor = after
        while True:
            page = min(1000, limit - len(rows)) if limit else 1000
            batch = c.store.list_tasks(
                campaign_id, state=wanted, search=search, after=cursor, limit=page
            )
            rows.extend(task_dict(t) for t in batch)
            if len(batch) < page or (limit and len(rows) >= limit):
                break
            cursor = batch[-1].position
    if as_json:
        _json(
            [
                {
                    k: r[k]
                    for k in (
                        "id",
                        "email",
                        "state",
                        "send_at",
                        "sent_at",
                        "attempts",
                        "message_id",
                        "error",
                    )
                }
                for r in rows
            ]
        )
        return
    table = Table(title=f"{len(rows)} email(s)")
    for col in ("id", "email", "state", "send_at", "sent_at", "attempts", "error"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["id"],
            r["email"],
            r["state"],
            r["send_at"] or "",
            r["sent_at"] or "",
            str(r["attempts"]),
            (r["error"] or "")[:60],
        )
    out.print(table)


@task_app.command("cancel")
@handle_errors
def task_cancel(task_id: str, as_json: JsonOpt = False) -> None:
    """Cancel one Pending email and delete its schedule."""
    with _container() as c:
        task = c.campaigns.cancel_task(task_id)
    if as_json:
        _json(task_dict(task))
    else:
        out.print(f"{task.id} ({task.email}) is {task.state.value}", markup=False)


@dlq_app.command("list")
@handle_errors
def dlq_list(as_json: JsonOpt = False) -> None:
    """Invocations that failed after their retries."""
    with _container() as c:
        letters = [dead_letter_dict(d) for d in c.scheduler.dead_letters()]
    if as_json:
        _json(letters)
        return
    table = Table(title=f"{len(letters)} dead letter(s)")
    for col in ("id", "schedule", "payload", "attempts", "failed_at", "error"):
        table.add_column(col)
    for d in letters:
        table.add_row(
            d["id"],
            d["schedule"],
            json.dumps(d["payload"]),
            str(d["attempts"]),
            d["failed_at"],
            d["error"][:80],
        )
    out.print(table)


@dlq_app.command("redrive")
@handle_errors
def dlq_redrive(
    letter_id: Annotated[str | None, typer.Argument(help="Dead letter id.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Redrive every dead letter.")] = False,
) -> None:
    """Turn dead letters back into schedules due now."""
    if bool(letter_id) == all_:
        raise InvalidField("id", letter_id, "give one dead-letter id, or --all")
    with _container() as c:
        if not all_:
            schedule = c.scheduler.redrive(letter_id or "")
            out.print(f"redriven {letter_id} as {schedule.name}", markup=False)
            return
        report = redrive_all(c.scheduler)
    for letter, schedule_name in zip(report.redriven, report.schedules, strict=True):
        out.print(f"redriven {letter} as {schedule_name}", markup=False)
    for letter in report.skipped:
        out.print(f"skipped {letter}: redriven by someone else meanwhile", markup=False)
    if not report.redriven and not report.skipped:
        out.print("the dead-letter queue is empty")


@app.command("reconcile")
@handle_errors
def reconcile_cmd(as_json: JsonOpt = False) -> None:
    """One reconciler pass: repair drift between the store and the execution layer."""
    with _container() as c:
        report = c.reconciler.run()
    if as_json:
        _json(report.as_dict())
        return
    if not report.ran:
        out.print("another reconciler pass is running; nothing done")
        return
    data = report.as_dict()
    for key, value in data.items():
        if key not in {"ran", "errors"}:
            out.print(f"{key.replace('_', ' ')}: {value}")
    for e in report.errors:
        err.print(f"  {e}", markup=False)


def _install_signals(stop: threading.Event) -> None:
    def handler(signum: int, _frame: object) -> None:
        log.warning(
            "received %s: finishing in-flight sends, then stopping", signal.Signals(signum).name
        )
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _execution_layer(settings: Settings) -> str:
    """Where the schedules live, for the startup log lines (no secrets)."""
    if settings.execution == "procrastinate":
        return "procrastinate (the store's database)"
    if settings.execution == "eventbridge":
        # SENDQUEUE_SCHEDULER_URL means nothing here: the schedules are in AWS.
        return f"EventBridge Scheduler group {settings.schedule_group}"
    return redact_url(settings.scheduler_url)


@app.command("worker")
@handle_errors
def worker_cmd(
    reconcile_interval: Annotated[
        float | None,
        typer.Option(
            "--reconcile-interval",
            help="Seconds between passes [default: SENDQUEUE_RECONCILE_INTERVAL]",
        ),
    ] = None,
) -> None:
    """Run the dispatcher, the send workers and the periodic reconciler until SIGTERM/SIGINT."""
    logging.getLogger("sendqueue").setLevel(logging.INFO)
    stop = threading.Event()
    _install_signals(stop)
    with _container() as c:
        # Under eventbridge there is no dispatcher to run (Lambda is it): this refuses with
        # the reason before anything is logged as started.
        c.dispatcher  # noqa: B018
        log.info(
            "worker started: store %s, scheduler %s, mailer %s",
            redact_url(c.settings.database_url),
            _execution_layer(c.settings),
            redact_url(c.settings.mailer),
        )
        run_worker(c, stop, reconcile_interval=reconcile_interval)
    log.info("worker stopped")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@app.command("serve")
@handle_errors
def serve_cmd(
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (not loopback: needs a token).")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", help="Port to listen on (0: any free one).")
    ] = 8000,
    no_worker: Annotated[
        bool,
        typer.Option(
            "--no-worker",
            help="Only the web app; run `sendqueue worker` to send the emails. Implied under "
            "SENDQUEUE_EXECUTION=eventbridge (the send Lambda function sends them).",
        ),
    ] = False,
    reconcile_interval: Annotated[
        float | None,
        typer.Option(
            "--reconcile-interval",
            help="Seconds between reconciler passes [default: SENDQUEUE_RECONCILE_INTERVAL]",
        ),
    ] = None,
) -> None:
    """Run the web UI and the HTTP API, with the worker embedded unless --no-worker."""
    if not 0 <= port <= 65535:
        raise InvalidField("port", port, "between 0 and 65535")
    logging.getLogger("sendqueue").setLevel(logging.INFO)
    with _container() as c:
        if c.settings.api_token is None and not _is_loopback(host):
            _fail(
                2,
                f"refusing to serve on {host} without SENDQUEUE_API_TOKEN: anyone who can reach "
                "it could read and send your campaigns; set a token (16+ characters) or use "
                "--host 127.0.0.1",
            )
        from sendqueue.web.app import create_app, run_server

        # Under eventbridge the worker is the send Lambda function, invoked by EventBridge
        # Scheduler: there is none to run here, so serve implies --no-worker (refusing would
        # only make every AWS user type a flag that changes nothing; the emails go out either
        # way) and says so.
        in_lambda = c.settings.execution == "eventbridge"
        if in_lambda and not no_worker:
            log.info(
                "SENDQUEUE_EXECUTION=eventbridge: no worker in this process (as with "
                "--no-worker); EventBridge Scheduler invokes the send Lambda function"
            )
        start_worker = not (no_worker or in_lambda)
        web = create_app(c, start_worker=start_worker, reconcile_interval=reconcile_interval)
        if in_lambda:
            worker = "the send Lambda function"
        else:
            worker = "embedded" if start_worker else "off (run `sendqueue worker`)"

        def started(url: str) -> None:
            out.print(f"sendqueue is serving {url}  (worker: {worker})", markup=False)
            if c.settings.api_token is not None:
                out.print("log in with SENDQUEUE_API_TOKEN, or send it as a Bearer token")

        log.info(
            "serving: store %s, scheduler %s, mailer %s",
            redact_url(c.settings.database_url),
            _execution_layer(c.settings),
            redact_url(c.settings.mailer),
        )
        run_server(web, host=host, port=port, on_started=started)
    log.info("server stopped")


@db_app.command("upgrade")
@handle_errors
def db_upgrade() -> None:
    """Apply the schema migrations to SENDQUEUE_DATABASE_URL."""
    from sendqueue.adapters.migrate import current, upgrade

    settings = Settings()
    upgrade(settings.database_url)
    out.print(f"database at revision {current(settings.database_url)}")
    if settings.execution == "procrastinate":
        from sendqueue.adapters.procrastinate_scheduler import upgrade_schema

        out.print(f"procrastinate schema at {upgrade_schema(settings.database_url)}")


@db_app.command("backup")
@handle_errors
def db_backup(
    path: Annotated[
        Path, typer.Argument(help="A new directory for store.db, scheduler.db and backup.json.")
    ],
    as_json: JsonOpt = False,
) -> None:
    """Online, consistent copy of the SQLite task store and the scheduler file (safe while
    workers run). For PostgreSQL it prints the pg_dump advice and exits 2."""
    from sendqueue.ops.backup import backup_sqlite, is_postgres, postgres_advice

    with _container() as c:  # settings only: opens no store
        settings = c.settings
        now = c.clock.now()
    if is_postgres(settings.database_url):
        _fail(2, postgres_advice(settings.database_url, str(path)))
    report = backup_sqlite(
        settings.database_url,
        settings.scheduler_url if settings.execution == "embedded" else None,
        path,
        now=now,
    )
    if as_json:
        _json(report.as_dict())
        return
    for copied in (report.store, report.scheduler):
        if copied is not None:
            rows = ", ".join(f"{n} {k}" for k, n in copied.rows.items())
            out.print(
                f"{copied.source} -> {copied.target} ({copied.bytes} bytes; {rows})",
                markup=False,
            )
    out.print(
        f"backup complete in {report.directory}; to restore, put both files back with the "
        "workers stopped, then run `sendqueue reconcile`",
        markup=False,
    )


@db_app.command("migrate-to")
@handle_errors
def db_migrate_to(
    url: Annotated[
        str, typer.Argument(help="The empty PostgreSQL database: postgresql+psycopg://...")
    ],
    as_json: JsonOpt = False,
) -> None:
    """Copy this SQLite deployment into PostgreSQL and schedule its pending emails there
    (procrastinate). Stop every worker first; see docs/deploy-postgres.md."""
    from sendqueue.adapters.sql_store import SqlTaskStore
    from sendqueue.ops.migrate_to import migrate_to

    with _container() as source:
        try:
            settings = Settings(
                **{
                    **source.settings.model_dump(),
                    "database_url": url,
                    "execution": "procrastinate",
                }
            )
        except Exception as exc:  # pydantic's ValidationError
            _fail(2, "invalid target: " + " ".join(str(exc).split())[:300])
        target = bootstrap(settings)
        try:
            store = target.store
            assert isinstance(store, SqlTaskStore)
            report = migrate_to(
                source.settings.database_url,
                store,
                target.writer,
                target.clock,
                target_label=redact_url(url),
                retire_group=source.writer.delete_group,
            )
        finally:
            target.close()
    if as_json:
        _json(report.as_dict())
        return
    out.print(
        f"copied {report.campaigns} campaign(s), {report.tasks} email(s), {report.changes} "
        f"change(s); {report.schedules_created} of {report.pending} pending email(s) scheduled"
    )
    for error in report.schedule_errors:
        err.print(f"  not scheduled (the reconciler retries): {error}", markup=False)
    if report.retired:
        out.print(f"paused in the old database: {', '.join(report.retired)}")
    out.print(
        f"next: run the workers with SENDQUEUE_DATABASE_URL={redact_url(url)} "
        "SENDQUEUE_EXECUTION=procrastinate",
        markup=False,
    )


# -- demo -------------------------------------------------------------------------------------
@app.command("demo")
@handle_errors
def demo_cmd(
    count: Annotated[int, typer.Option("--count", help="Emails in the demo campaign.")] = 24,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between sends.")] = 5.0,
    ui: Annotated[
        bool,
        typer.Option(
            "--ui/--no-ui",
            help="Serve the web UI with the worker embedded (--no-ui: a live table in the "
            "terminal, exiting when every email is sent).",
        ),
    ] = True,
    port: Annotated[
        int, typer.Option("--port", help="Web UI port on 127.0.0.1 (taken: any free one).")
    ] = 8000,
) -> None:
    """Create a sample campaign that sends within seconds, then watch it deliver live."""
    if not 1 <= count <= 1000:
        raise InvalidField("count", count, "between 1 and 1000")
    if not 0.5 <= interval <= 3600:
        raise InvalidField("interval", interval, "between 0.5 and 3600 seconds")
    with _container() as c:
        now = c.clock.now()
        policy = demo_policy(now, c.settings.default_timezone, count, interval)
        created = c.campaigns.create(
            name=f"Demo {now.astimezone(policy.zone):%Y-%m-%d %H:%M}",
            recipients=demo_csv(count),
            policy=policy,
            from_addr="sendqueue demo <demo@example.com>",
            templates=Templates(
                subject="Hello {{ name }}, greetings to {{ city }}",
                body="Hi {{ name }},\n\nthis is email from the sendqueue demo.\n",
            ),
        )
        cid = created.campaign.id
        out.print(f"demo campaign [bold]{cid}[/]: {count} emails, one every {interval:g}s")
        out.print(f"policy: {policy.describe()}", markup=False)
        out.print(
            f"mailer: {redact_url(c.settings.mailer)}  store: {redact_url(c.settings.database_url)}"
        )
        report = _provision_with_progress(c, cid, None, 90.0)
        _print_provision(report)
        if ui:
            _demo_ui(c, cid, port)
            return
        stop = threading.Event()
        _install_signals(stop)
        worker = threading.Thread(
            target=run_worker, args=(c, stop), kwargs={"reconcile_at_start": False}, daemon=True
        )
        worker.start()
        try:
            with Live(_demo_table(c, cid), console=out, refresh_per_second=4) as live:
                while not stop.wait(0.5):
                    live.update(_demo_table(c, cid))
                    if c.store.get_campaign(cid).state is CampaignState.COMPLETED:
                        break
        finally:
            stop.set()
            worker.join(timeout=60)
        counts = c.store.count_tasks(cid)
        out.print(
            f"done: {counts[TaskState.FINISHED]} sent, {counts[TaskState.FAILED]} failed. "
            f"Messages are in {c.settings.mailer.removeprefix('maildir:')}/new"
        )


def _free_port(preferred: int) -> int:
    """``preferred`` if it can be bound on loopback, else 0 (any free port)."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", preferred))
        except OSError:
            return 0
    return preferred


def _demo_ui(c: Container, cid: str, port: int) -> None:
    from sendqueue.web.app import create_app, run_server

    web = create_app(c, start_worker=True)

    def started(url: str) -> None:
        out.print(f"\nsendqueue is serving {url}", markup=False)
        out.print(f"watch the demo live: [bold]{url}campaigns/{cid}[/]")
        out.print("press Ctrl-C to stop")

    run_server(web, host="127.0.0.1", port=_free_port(port), on_started=started)


def _demo_table(c: Container, cid: str) -> Table:
    counts = c.store.count_tasks(cid)
    campaign = c.store.get_campaign(cid)
    table = Table(
        title=f"campaign {cid}: {campaign.state.value}  "
        + "  ".join(f"{s.value} {counts[s]}" for s in TaskState)
    )
    for col in ("#", "email", "state", "send at (local)", "sent at", "late (s)"):
        table.add_column(col)
    zone = campaign.policy.zone
    for t in c.store.list_tasks(cid, limit=1000):
        late = f"{(t.sent_at - t.send_at).total_seconds():.2f}" if t.sent_at else ""
        table.add_row(
            str(t.position),
            t.email,
            t.state.value,
            t.send_at.astimezone(zone).strftime("%H:%M:%S"),
            t.sent_at.astimezone(zone).strftime("%H:%M:%S.%f")[:-3] if t.sent_at else "",
            late,
        )
    return table


def main() -> None:
    """Console entry point."""
    app()


if __name__ == "__main__":
    main()
