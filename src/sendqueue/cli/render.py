"""Output shared by several command groups: plans of send times and provisioning progress."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sendqueue.bootstrap import Container
from sendqueue.cli.common import err, out
from sendqueue.domain.planner import per_day_summary
from sendqueue.domain.policy import load_timezone
from sendqueue.services.provisioning import ProvisionProgress, ProvisionReport
from sendqueue.services.views import iso

__all__ = ["plan_rows", "print_plan", "print_provision", "provision_with_progress"]


def plan_rows(sends: list[datetime], zone_name: str) -> list[dict[str, Any]]:
    """The ``--json`` rows of a plan: index, UTC time and local time."""
    zone = load_timezone(zone_name)
    return [
        {"index": i, "send_at": iso(s), "local": s.astimezone(zone).isoformat()}
        for i, s in enumerate(sends)
    ]


def print_plan(sends: list[datetime], zone_name: str, *, rows: int = 50) -> None:
    """A plan as a table (first and last rows) and a per-day summary."""
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
        f"{report.campaign_id}: {messages[report.status]} - {report.tasks_created} tasks and "
        f"{report.schedules_created} schedules created of {report.total} in {report.seconds:.1f}s"
        + (f", {report.throttled} throttled call(s) retried" if report.throttled else "")
        + (f", {report.suppressed} suppressed (created Cancelled)" if report.suppressed else "")
    )
    for e in report.errors[:10]:
        err.print(f"  {e}", markup=False)
