"""``sendqueue dlq``: the dead-letter queue of failed invocations."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from sendqueue.cli.common import JsonOpt, container, handle_errors, out, print_json
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.wording import plural
from sendqueue.services.reading.views import dead_letter_dict

__all__ = ["dlq_app"]

dlq_app = typer.Typer(help="The dead-letter queue of failed invocations.", no_args_is_help=True)


@dlq_app.command("list")
@handle_errors
def dlq_list(as_json: JsonOpt = False) -> None:
    """Invocations that failed after their retries."""
    with container() as c:
        letters = [dead_letter_dict(d) for d in c.dead_letter_queue.letters()]
    if as_json:
        print_json(letters)
        return
    table = Table(title=plural(len(letters), "dead letter"))
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
    """Turn dead letters back into schedules due now (each relayed to the change log first, so
    it keeps its dead_letter webhook event)."""
    if bool(letter_id) == all_:
        raise InvalidField("id", letter_id, "give one dead-letter id, or --all")
    with container() as c:
        if not all_:
            schedule = c.dead_letter_queue.redrive(letter_id or "")
            out.print(f"redriven {letter_id} as {schedule.name}", markup=False)
            return
        report = c.dead_letter_queue.redrive_all(
            on_redriven=lambda letter, name: out.print(
                f"redriven {letter} as {name}", markup=False
            ),
        )
    for letter in report.skipped:
        out.print(f"skipped {letter}: redriven by someone else meanwhile", markup=False)
    for letter in report.failed_again:
        out.print(f"left {letter}: its schedule failed again during this pass", markup=False)
    if not (report.redriven or report.skipped or report.failed_again):
        out.print("the dead-letter queue is empty")
