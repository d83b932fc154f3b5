"""``/api/campaigns/{id}/steps``: edit a running sequence, thin routes over
:class:`~sendqueue.services.sequences.editing.SequenceEditor` (docs/sequences.md).

``POST`` appends a step; ``PATCH .../steps/{number}`` changes a step's subject, text or html
(only the fields given; null removes a later step's subject or a step's html). A bad value is
a 422 naming the field (``steps[4].text``) and nothing changes; a cancelled campaign, or a step
whose emails are all sent, is a 409.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.steps import Step
from sendqueue.services.sequences.editing import UNCHANGED
from sendqueue.web.deps import SequenceEditorDep
from sendqueue.web.schemas import WRITE_ERRORS, error_responses

__all__ = ["router"]

router = APIRouter(prefix="/api/campaigns", tags=["campaigns"])

_ERRORS = error_responses(*WRITE_ERRORS, 404, 409)


class NewStep(BaseModel):
    """The body of ``POST /api/campaigns/{id}/steps``: a step appended to the sequence."""

    model_config = ConfigDict(extra="forbid")
    text: str = Field(description="the text body template")
    after: str = Field(description="the wait after the previous step: 3d (sending days), 4h, 30m")
    subject: str | None = Field(None, description="subject template; null: Re: step 1's")
    html: str | None = Field(None, description="the HTML body template; null: text only")
    new_thread: bool = Field(False, description="start a new thread instead of replying")


class StepChanges(BaseModel):
    """The body of ``PATCH /api/campaigns/{id}/steps/{number}``: only the fields given
    change; null removes a later step's subject (it replies with Re:) or the html."""

    model_config = ConfigDict(extra="forbid")
    subject: str | None = None
    text: str | None = None
    html: str | None = None


class StepOut(BaseModel):
    """A step of a sequence, as templates."""

    number: int
    subject: str | None
    text: str
    html: str | None
    after: str | None = Field(description="the wait after the previous step; null for step 1")
    new_thread: bool


class StepAddedOut(BaseModel):
    """What adding a step did."""

    campaign_id: str
    step: StepOut
    recipients_reached: int = Field(description="recipients who got the new step now")
    reopened: bool = Field(description="whether a completed campaign was reopened for it")


class StepUpdatedOut(BaseModel):
    """What changing a step did."""

    campaign_id: str
    step: StepOut
    rerendered: int = Field(description="Pending emails of the step rendered anew")
    cancelled: int = Field(description="Pending emails cancelled: the template fails for the row")


def _out(step: Step) -> StepOut:
    return StepOut(
        number=step.number, subject=step.subject, text=step.text, html=step.html,
        after=None if step.after is None else step.after.text, new_thread=step.new_thread,
    )  # fmt: skip


@router.post("/{campaign_id}/steps", status_code=201, responses=_ERRORS)
def add_step(campaign_id: str, body: NewStep, editor: SequenceEditorDep) -> StepAddedOut:
    """Append a step; every recipient who finished the sequence without an answer gets it,
    and a completed campaign is reopened."""
    added = editor.add_step(campaign_id, **body.model_dump())
    return StepAddedOut(
        campaign_id=added.campaign_id, step=_out(added.step), recipients_reached=added.made,
        reopened=added.reopened,
    )  # fmt: skip


@router.patch("/{campaign_id}/steps/{number}", responses=_ERRORS)
def update_step(
    campaign_id: str, number: int, body: StepChanges, editor: SequenceEditorDep
) -> StepUpdatedOut:
    """Change the fields given; the step's Pending emails are rendered anew (sent ones keep
    the text they went out with)."""
    given: dict[str, Any] = body.model_dump(exclude_unset=True)
    if not given:
        raise InvalidField("body", {}, "give subject, text or html")
    if "text" in given and given["text"] is None:
        raise InvalidField(f"steps[{number}].text", None, "a step needs a text body")
    changes = {part: given.get(part, UNCHANGED) for part in ("subject", "text", "html")}
    done = editor.update_step(campaign_id, number, **changes)
    return StepUpdatedOut(
        campaign_id=done.campaign_id, step=_out(done.step), rerendered=done.rerendered,
        cancelled=done.cancelled,
    )  # fmt: skip
