"""``sendqueue task``: act on a single email."""

from __future__ import annotations

import typer

from sendqueue.cli.common import JsonOpt, container, handle_errors, out, print_json
from sendqueue.services.views import task_dict

__all__ = ["task_app"]

task_app = typer.Typer(help="Act on a single email.", no_args_is_help=True)


@task_app.command("cancel")
@handle_errors
def task_cancel(task_id: str, as_json: JsonOpt = False) -> None:
    """Cancel one Pending email and delete its schedule."""
    with container() as c:
        task = c.campaigns.cancel_task(task_id)
    if as_json:
        print_json(task_dict(task))
    else:
        out.print(f"{task.id} ({task.email}) is {task.state.value}", markup=False)
