"""The steps of a sequence in ``sendqueue campaign``: ``create --steps`` reads them, and
``create`` and ``show`` print them with their counts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from sendqueue.cli.common import out
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.steps import Step
from sendqueue.services.campaigns.steps_file import read_steps_file
from sendqueue.services.importing.recipients import Templates
from sendqueue.services.templates.render import TemplateLimits

__all__ = ["STEP_COUNT_COLUMNS", "StepsOpt", "print_steps", "read_steps"]

StepsOpt = Annotated[
    Path | None,
    typer.Option(
        "--steps",
        help="YAML or JSON steps file making the campaign a sequence (docs/sequences.md). "
        "With --subject and --body-file (step 1), it holds steps 2 on, each with 'after'.",
    ),
]

#: The counts ``campaign show`` prints per step: (column, state or outcome, which).
STEP_COUNT_COLUMNS = (
    ("pending", "Pending", "counts"),
    ("sent", "Finished", "counts"),
    ("replied", "replied", "outcomes"),
    ("bounced", "bounced", "outcomes"),
    ("unsubscribed", "unsubscribed", "outcomes"),
    ("cancelled", "Cancelled", "counts"),
)

# The names of step 1's keys as the options that give it spell them.
_OPTION_OF_KEY = {"subject": "subject", "text": "body_file", "html": "html_file"}


def read_steps(
    path: Path | None, templates: Templates, limits: TemplateLimits
) -> tuple[list[Step] | None, Templates]:
    """The steps of ``--steps`` and the templates left for the import. Without template
    options the file holds every step; with them they make step 1 (both --subject and
    --body-file needed) and the file holds steps 2 on."""
    if path is None:
        return None, templates
    if not any((templates.subject, templates.body, templates.html)):
        return read_steps_file(path, limits), templates
    for key, given in (("subject", templates.subject), ("body_file", templates.body)):
        if given is None:
            raise InvalidField(
                key,
                None,
                "with --steps, step 1 needs both --subject and --body-file (the file then "
                "holds steps 2 on), or none of them and step 1 in the steps file",
            )
    try:
        first = Step(1, templates.subject, templates.body or "", templates.html or None, None)
    except InvalidField as exc:  # named after the options that gave it
        key = _OPTION_OF_KEY.get(exc.field.partition(".")[2], exc.field)
        raise InvalidField(key, exc.value, exc.reason) from None
    return read_steps_file(path, limits, first=first), Templates()


def print_steps(steps: list[dict[str, Any]], *, counts: bool = True) -> None:
    """The steps of a campaign view (``steps``), with their counts unless ``counts`` is
    False (a new draft has none)."""
    table = Table(title="steps", title_justify="left")
    for col in ("step", "after", "subject", "thread"):
        table.add_column(col)
    if counts:
        for col, _, _ in STEP_COUNT_COLUMNS:
            table.add_column(col, justify="right")
    for step in steps:
        thread = "new" if step["new_thread"] else ("start" if step["number"] == 1 else "reply")
        row: list[str | Text] = [
            str(step["number"]),
            step["after"] or "-",
            Text(step["subject"] if step["subject"] is not None else "(each recipient's own)"),
            thread,
        ]
        if counts:
            row += [str(step[which][key]) for _, key, which in STEP_COUNT_COLUMNS]
        table.add_row(*row)
    out.print(table)
