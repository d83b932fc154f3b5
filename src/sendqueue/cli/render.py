"""Output shared by several command groups: plans of send times and provisioning progress."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sendqueue.bootstrap import Container
from sendqueue.cli.common import err, out
from sendqueue.domain.planner import per_day_summary
from sendqueue.domain.policy import load_timezone
from sendqueue.domain.step_load import StepLoad
from sendqueue.domain.wording import plural
from sendqueue.services.campaigns.preview import ZoneDays
from sendqueue.services.reading.views import iso
from sendqueue.services.scheduling.provisioning import ProvisionProgress, ProvisionReport

__all__ = [
    "plan_rows",
    "print_plan",
    "print_provision",
    "print_step_load",
    "print_zones",
    "provision_with_progress",
    "step_rows",
    "zone_rows",
]

# A send time as the tables show it: "Fri 2026-12-04 09:30:00 CET".
_WHEN = "%a %Y-%m-%d %H:%M:%S %Z"


def plan_rows(sends: list[datetime], zone_name: str) -> list[dict[str, Any]]:
    """The ``--json`` rows of a plan: index, UTC time and local time."""
    zone = load_timezone(zone_name)
    return [
        {"index": i, "send_at": iso(s), "local": s.astimezone(zone).isoformat()}
        for i, s in enumerate(sends)
    ]


def print_plan(
    sends: list[datetime],
    zone_name: str,
    *,
    emails: Sequence[str] | None = None,
    zones: Sequence[str] | None = None,
    rows: int = 50,
) -> None:
    """A plan as a table (first and last rows) and a per-day summary. ``emails`` adds each
    send's address; ``zones`` (a local-time campaign) each recipient's zone and own time."""
    zone = load_timezone(zone_name)
    table = Table(title=f"{plural(len(sends), 'send')} ({zone_name})", show_lines=False)
    table.add_column("#", justify="right")
    if emails is not None:
        table.add_column("address")
    table.add_column("send at (UTC)")
    table.add_column(f"local ({zone_name})")
    if zones is not None:
        table.add_column("recipient's time")

    def row(i: int) -> list[str]:
        s = sends[i]
        cells = [str(i)]
        if emails is not None:
            cells.append(emails[i])
        cells += [iso(s) or "", s.astimezone(zone).strftime(_WHEN)]
        if zones is not None:
            own = s.astimezone(load_timezone(zones[i]))
            cells.append(f"{own.strftime('%a %Y-%m-%d %H:%M:%S')} {zones[i]}")
        return cells

    shown = len(sends) if len(sends) <= rows else rows - 1
    for i in range(shown):
        table.add_row(*row(i))
    if len(sends) > rows:
        gap = ["...", f"{len(sends) - shown - 1} more"]
        table.add_row(*gap, *[""] * (len(table.columns) - len(gap)))
        table.add_row(*row(len(sends) - 1))
    out.print(table)
    days = per_day_summary(sends, zone_name)
    summary = Table(title=f"per day: {plural(len(days), 'sending day')}")
    summary.add_column("day")
    summary.add_column("sends", justify="right")
    summary.add_column("first")
    summary.add_column("last")
    for day in days[:60]:
        summary.add_row(
            day.day.strftime("%a %Y-%m-%d"),
            str(day.count),
            day.first.strftime("%H:%M:%S %Z"),
            day.last.strftime("%H:%M:%S %Z"),
        )
    if len(days) > 60:
        summary.add_row(
            "...",
            f"{sum(d.count for d in days[60:])} in {plural(len(days) - 60, 'more day')}",
            "",
            "",
        )
    out.print(summary)


def zone_rows(zones: tuple[ZoneDays, ...]) -> list[dict[str, Any]]:
    """The ``--json`` form of a preview's per-zone summary: each recipient zone with its sends
    per local day of that zone."""
    return [
        {
            "zone": z.zone,
            "count": z.count,
            "days": [
                {
                    "day": d.day.isoformat(),
                    "count": d.count,
                    "first": d.first.isoformat(),
                    "last": d.last.isoformat(),
                }
                for d in z.days
            ],
        }
        for z in zones
    ]


def print_zones(zones: tuple[ZoneDays, ...]) -> None:
    """The sends per recipient zone, each in its own local days (a local-time campaign)."""
    table = Table(
        title=f"per recipient zone: {plural(len(zones), 'zone')}, in each zone's local time"
    )
    for col in ("zone", "sends", "days", "first day", "last day"):
        table.add_column(col, justify="right" if col in {"sends", "days"} else "left")
    for z in zones:
        first = z.days[0].first.strftime("%a %Y-%m-%d %H:%M") if z.days else ""
        last = z.days[-1].last.strftime("%a %Y-%m-%d %H:%M") if z.days else ""
        table.add_row(z.zone, str(z.count), str(len(z.days)), first, last)
    out.print(table)


def step_rows(loads: tuple[StepLoad, ...]) -> list[dict[str, Any]]:
    """The ``--json`` form of a sequence's expected sends per day and step."""
    return [
        {
            "step": load.step,
            "after": load.after,
            "count": load.count,
            "days": [{"day": day.isoformat(), "count": n} for day, n in load.days],
        }
        for load in loads
    ]


def print_step_load(loads: tuple[StepLoad, ...], zone_name: str, *, rows: int = 60) -> None:
    """A sequence's expected sends as a table of local days (``zone_name``) by step."""
    per_day: dict[date, list[int]] = {}
    for column, load in enumerate(loads):
        for day, n in load.days:
            per_day.setdefault(day, [0] * len(loads))[column] = n
    days = sorted(per_day)
    table = Table(title=f"per day and step ({zone_name}): an estimate if no one answers")
    table.add_column("day")
    for load in loads:
        head = f"step {load.step}" + (f" (+{load.after})" if load.after else "")
        table.add_column(head, justify="right")
    table.add_column("all", justify="right")
    for day in days[:rows]:
        counts = per_day[day]
        table.add_row(day.strftime("%a %Y-%m-%d"), *map(str, counts), str(sum(counts)))
    if len(days) > rows:
        rest = [sum(per_day[d][c] for d in days[rows:]) for c in range(len(loads))]
        more = f"{plural(len(days) - rows, 'more day')}"
        table.add_row(more, *map(str, rest), str(sum(rest)))
    table.add_row("total", *(str(load.count) for load in loads), str(sum(x.count for x in loads)))
    out.print(table)


def provision_with_progress(
    c: Container, campaign_id: str, time_budget: float | None, safety_margin: float
) -> ProvisionReport:
    """Provision ``campaign_id`` with a progress bar per phase on stderr."""
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


def print_provision(report: ProvisionReport) -> None:
    """One line on what provisioning did, and its first errors on stderr."""
    messages = {
        "done": "provisioned",
        "continued": "time budget spent; the worker continues from the checkpoint",
        "stopped": "stopped: scheduler calls failed; the checkpoint is kept "
        "(run again, or the reconciler resumes it)",
        "busy": "another process is provisioning this campaign",
    }
    out.print(
        f"{report.campaign_id}: {messages[report.status]} - {plural(report.tasks_created, 'task')} "
        f"and {plural(report.schedules_created, 'schedule')} created of {report.total} in "
        f"{report.seconds:.1f}s"
        + (f", {plural(report.throttled, 'throttled call')} retried" if report.throttled else "")
        + (f", {report.suppressed} suppressed (created Cancelled)" if report.suppressed else "")
    )
    for e in report.errors[:10]:
        err.print(f"  {e}", markup=False)
