"""``sendqueue task``: look at or act on a single email."""

from __future__ import annotations

import typer

from sendqueue.cli.common import JsonOpt, container, handle_errors, out, print_json
from sendqueue.domain.lifecycle import CampaignState
from sendqueue.domain.wording import plural
from sendqueue.services.reading.views import task_dict

__all__ = ["task_app"]

task_app = typer.Typer(help="Look at or act on a single email.", no_args_is_help=True)


@task_app.command("show")
@handle_errors
def task_show(task_id: str, as_json: JsonOpt = False) -> None:
    """One email: its state, times, error and outcome (what happened after sending)."""
    with container() as c:
        campaign, task = c.queries.task(task_id)
        sender = c.queries.sender_of(campaign, task)
    paused = campaign.state is CampaignState.PAUSED
    data = task_dict(task, campaign_paused=paused, from_addr=campaign.from_addr, sender=sender)
    if as_json:
        print_json(data)
        return
    out.print(f"{data['id']} ({data['email']}) is {data['state']}", markup=False)
    out.print(f"subject: {data['subject']}", markup=False)
    send_at = "paused" if data["paused"] else data["send_at"]
    sent_at = (data["sent_at"] or "-") + (" (late)" if data["late"] else "")
    out.print(f"send at: {send_at}  sent at: {sent_at}  attempts: {data['attempts']}")
    if data["moves"]:
        out.print(
            f"moved {plural(data['moves'], 'time')}: {data['moved_reason'] or ''}", markup=False
        )
    if data["error"] or data["reason"]:
        out.print(f"error/reason: {data['error'] or data['reason']}", markup=False)
    if data["outcome"]:
        detail = f" ({data['outcome_detail']})" if data["outcome_detail"] else ""
        out.print(f"outcome: {data['outcome']}{detail} at {data['outcome_at']}", markup=False)
    else:
        out.print("outcome: -")


@task_app.command("cancel")
@handle_errors
def task_cancel(task_id: str, as_json: JsonOpt = False) -> None:
    """Cancel one Pending email and delete its schedule."""
    with container() as c:
        task = c.campaign_controls.cancel_task(task_id)
        campaign = c.queries.campaign_of(task.campaign_id)
        sender = c.queries.sender_of(campaign, task)
    if as_json:
        print_json(task_dict(task, from_addr=campaign.from_addr, sender=sender))
    else:
        out.print(f"{task.id} ({task.email}) is {task.state.value}", markup=False)
