"""``sendqueue campaign step``: edit a running sequence (add a step, change a step's text)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from sendqueue.cli.common import JsonOpt, container, handle_errors, out, print_json
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.steps import Step, steps_to_data
from sendqueue.domain.wording import plural
from sendqueue.services.sequences.editing import UNCHANGED, Unchanged

__all__ = ["step_app"]

step_app = typer.Typer(
    help="Edit a running sequence: add a step at the end, change a step's text.",
    no_args_is_help=True,
)

SubjectOpt = Annotated[
    str | None,
    typer.Option("--subject", help="Subject template; a later step without one replies (Re:)."),
]
BodyFileOpt = Annotated[Path | None, typer.Option("--body-file", help="Text body template file.")]
HtmlFileOpt = Annotated[Path | None, typer.Option("--html-file", help="HTML body template file.")]


def _read_text(path: Path, field: str) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidField(field, str(path), f"cannot read it: {exc}") from exc


def _step_json(step: Step) -> dict[str, Any]:
    return {"number": step.number, **steps_to_data([step])[0]}


@step_app.command("add")
@handle_errors
def step_add(
    campaign_id: str,
    after: Annotated[
        str,
        typer.Option("--after", help="Wait after the previous step: 3d (sending days), 4h, 30m."),
    ],
    body_file: Annotated[Path, typer.Option("--body-file", help="Text body template file.")],
    subject: SubjectOpt = None,
    html_file: HtmlFileOpt = None,
    new_thread: Annotated[
        bool, typer.Option("--new-thread", help="Start a new thread instead of replying.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Append a step; every recipient who finished the sequence without an answer gets it."""
    text = _read_text(body_file, "body_file")
    html = _read_text(html_file, "html_file") if html_file else None
    with container() as c:
        added = c.sequence_editor.add_step(
            campaign_id, text=text, after=after, subject=subject, html=html, new_thread=new_thread
        )
    if as_json:
        print_json(
            {
                "campaign_id": added.campaign_id,
                "step": _step_json(added.step),
                "recipients_reached": added.made,
                "reopened": added.reopened,
            }
        )
        return
    out.print(
        f"step {added.step.number} added to {added.campaign_id}: "
        f"{plural(added.made, 'recipient')} got it now"
        + ("; the campaign was reopened" if added.reopened else ""),
        markup=False,
    )


@step_app.command("update")
@handle_errors
def step_update(
    campaign_id: str,
    number: int,
    subject: SubjectOpt = None,
    body_file: BodyFileOpt = None,
    html_file: HtmlFileOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change a step's subject, text or html; its Pending emails are rendered anew (sent ones
    keep the text they went out with)."""
    if subject is None and body_file is None and html_file is None:
        raise InvalidField("subject", None, "give --subject, --body-file or --html-file")
    text: str | Unchanged = _read_text(body_file, "body_file") if body_file else UNCHANGED
    html: str | Unchanged = _read_text(html_file, "html_file") if html_file else UNCHANGED
    with container() as c:
        done = c.sequence_editor.update_step(
            campaign_id, number, subject=UNCHANGED if subject is None else subject, text=text,
            html=html,
        )  # fmt: skip
    if as_json:
        print_json(
            {
                "campaign_id": done.campaign_id,
                "step": _step_json(done.step),
                "rerendered": done.rerendered,
                "cancelled": done.cancelled,
            }
        )
        return
    line = (
        f"step {done.step.number} of {done.campaign_id} updated: "
        f"{plural(done.rerendered, 'pending email')} re-rendered"
    )
    if done.cancelled:
        line += f", {done.cancelled} cancelled (the template fails for their row)"
    out.print(line, markup=False)
