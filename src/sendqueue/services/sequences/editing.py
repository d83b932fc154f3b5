"""Editing a running sequence: a step's text changed, a step added at the end.

- :meth:`SequenceEditor.update_step` changes a step's subject, text or html until its last
  email is sent. The campaign's stored steps are replaced (a compare-and-set on the steps read,
  so two editors never lose each other's change), then every Pending email of that step is
  rendered anew with its recipient's row. An email already claimed or sent keeps the text it
  went out with (the task's snapshot); one whose template now fails for its row is Cancelled
  with the reason, as a later step that cannot be rendered is when it is made.
- :meth:`SequenceEditor.add_step` appends a step (at most 10). The stored steps are replaced,
  a completed campaign is reopened, and :meth:`FollowUps.repair
  <sendqueue.services.sequences.followups.FollowUps.repair>` makes the new step for every
  recipient whose last step was sent and is still ``accepted`` (no answer, no bounce).

Templates are checked as the import checks them: compiled, then rendered for the first
recipient; a failure names its field (``steps[3].subject``) and nothing changes. The steps are
replaced under the campaign's re-plan lease, the lease a later step is made under, and the
follow-ups read the steps again under it: a step made while an edit lands is made as edited.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Final

from sendqueue.domain.errors import Conflict, IllegalTransition, InvalidField
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import Campaign, Recipient, Task, task_id
from sendqueue.domain.steps import MAX_STEPS, Delay, Step, check_steps, parse_delay, shown_value
from sendqueue.domain.transitions import Rerender, cancel, rerender
from sendqueue.ports import Clock
from sendqueue.ports.sequences import SequenceStore
from sendqueue.services.planning.replanning import RETRY_LEASE_WAIT, Replanner
from sendqueue.services.sequences.followups import FollowUps
from sendqueue.services.sequences.render import StepRenderer
from sendqueue.services.task_changes import apply_change

__all__ = ["UNCHANGED", "SequenceEditor", "StepAdded", "StepUpdated", "Unchanged"]

#: Pending emails of an edited step read and re-rendered at once.
_PAGE = 500
#: Times an edit is tried again on steps read afresh when another editor changed them first.
_ATTEMPTS = 3
#: Template parts of a step, as its fields are named in errors.
_PARTS = ("subject", "text", "html")


class Unchanged:
    """The type of :data:`UNCHANGED`: a part of a step left as it is."""

    def __repr__(self) -> str:
        return "UNCHANGED"


#: A part of a step :meth:`SequenceEditor.update_step` leaves as it is.
UNCHANGED: Final = Unchanged()


@dataclass(frozen=True)
class StepUpdated:
    """What :meth:`SequenceEditor.update_step` did: the step as stored now, how many Pending
    emails were rendered anew, and how many were cancelled (the template fails for their row)."""

    campaign_id: str
    step: Step
    rerendered: int
    cancelled: int


@dataclass(frozen=True)
class StepAdded:
    """What :meth:`SequenceEditor.add_step` did: the step stored, how many recipients got it
    now, and whether a completed campaign was reopened for it."""

    campaign_id: str
    step: Step
    made: int
    reopened: bool


class SequenceEditor:
    """Changes a running sequence's steps (module docstring)."""

    def __init__(
        self,
        store: SequenceStore,
        clock: Clock,
        replanner: Replanner,
        followups: FollowUps,
        renderer: StepRenderer,
    ) -> None:
        self._store = store
        self._clock = clock
        self._replanner = replanner
        self._followups = followups
        self._renderer = renderer

    # -- update --------------------------------------------------------------------------------

    def update_step(
        self,
        campaign_id: str,
        number: int,
        *,
        subject: str | Unchanged | None = UNCHANGED,
        text: str | Unchanged = UNCHANGED,
        html: str | Unchanged | None = UNCHANGED,
    ) -> StepUpdated:
        """Change step ``number``'s templates (a part given as None is removed: a later step
        without a subject replies to step 1's, a step without html is sent as text), then
        render its Pending emails anew. InvalidField names the field (``number`` too); a
        cancelled campaign, or a step whose emails are all sent, is refused
        (IllegalTransition); NotFound for an unknown campaign."""
        for _ in range(_ATTEMPTS):
            campaign = self._editable(campaign_id)
            old = _step_of(campaign, number)
            new = _changed(old, subject, text, html)
            steps = check_steps([*campaign.steps[: number - 1], new, *campaign.steps[number:]])
            self._check_renders(campaign, old, new)
            self._check_open(campaign, number)
            if new == old:
                return StepUpdated(campaign_id, new, 0, 0)
            if self._replace(campaign, steps):
                rerendered, cancelled = self._rerender_pending(campaign, old, new)
                return StepUpdated(campaign_id, new, rerendered, cancelled)
        raise Conflict(f"campaign {campaign_id}: its steps kept changing; read them and try again")

    def _check_open(self, campaign: Campaign, number: int) -> None:
        """A step can be edited until its last email is sent: refused once the campaign is
        completed, or when no email of this step or one before it is Pending or Running (no
        recipient can still get it). Step 1 of a campaign not provisioned yet is refused too:
        its emails are written from the rows rendered at import."""
        state = campaign.state
        if state is CampaignState.COMPLETED:
            raise IllegalTransition(
                "campaign", state.value, "edited", "every email has been sent; add a step instead"
            )
        if state in (CampaignState.DRAFT, CampaignState.PROVISIONING):
            if number == 1:
                raise IllegalTransition(
                    "campaign", state.value, "edited", "step 1 can be edited once it is started"
                )
            return
        for k in range(1, number + 1):
            for live in (TaskState.PENDING, TaskState.RUNNING):
                if self._store.list_tasks(campaign.id, state=live, step=k, limit=1):
                    return
        raise IllegalTransition(
            "step", number, "edited", f"every email of step {number} has been sent"
        )

    def _rerender_pending(self, campaign: Campaign, old: Step, step: Step) -> tuple[int, int]:
        """Render every Pending email of ``step`` anew with its recipient's row: (rendered
        anew, cancelled because the template fails for the row)."""
        rerendered = cancelled = 0
        note = f"re-rendered: step {step.number} edited"
        for page in self._pending_pages(campaign.id, step.number):
            recipients = self._recipients(campaign.id, [t.position for t in page])
            firsts = self._first_subjects(campaign.id, page, step)
            changes: list[Rerender] = []
            for task in page:
                found = recipients.get(task.position)
                if step.number == 1:
                    out = self._first_step(campaign, old, step, task, found)
                else:
                    first = firsts.get(task.position, task.subject)
                    out = self._renderer.render(campaign, step, found, first_subject=first)
                if isinstance(out, str):
                    cancelled += self._cancel(task, out)
                elif out is not None:
                    changes.append(rerender(task, *out))
            rerendered += self._store.rerender(changes, at=self._clock.now(), note=note)
        return rerendered, cancelled

    def _first_step(
        self, campaign: Campaign, old: Step, new: Step, task: Task, row: Recipient | None
    ) -> tuple[str, str, str | None] | str | None:
        """Step 1 of one recipient rendered anew. A part its row gave in its own cell (a
        subject, body or html column wins over the template at import) keeps the row's value:
        a part is the template's when it is what the old template renders for the row. None
        (left as it is) when the old template does not render for the row: the import took
        its cells then."""
        before = self._renderer.render(campaign, old, row, first_subject=task.subject)
        if isinstance(before, str):
            return None
        out = self._renderer.render(campaign, new, row, first_subject=task.subject)
        if isinstance(out, str):
            return out
        subject = out[0] if task.subject.strip() == before[0] else task.subject
        text = out[1] if task.text == before[1] else task.text
        html = out[2] if (task.html or None) == before[2] else task.html
        return subject, text, html

    def _pending_pages(self, campaign_id: str, number: int) -> Iterator[list[Task]]:
        after = -1
        while True:
            page = self._store.list_tasks(
                campaign_id, state=TaskState.PENDING, step=number, after=after, limit=_PAGE
            )
            if page:
                yield page
            if len(page) < _PAGE:
                return
            after = page[-1].position

    def _recipients(self, campaign_id: str, positions: Sequence[int]) -> dict[int, Recipient]:
        """The rows of ``positions`` (sorted), read a page at a time from the lowest one."""
        wanted = set(positions)
        found: dict[int, Recipient] = {}
        after, last = positions[0] - 1, positions[-1]
        while after < last:
            span = min(last - after, 1000)
            page = self._store.list_recipients(campaign_id, after=after, limit=span)
            found.update({r.position: r for r in page if r.position in wanted})
            if len(page) < span:
                break
            after = page[-1].position
        return found

    def _first_subjects(self, campaign_id: str, page: list[Task], step: Step) -> dict[int, str]:
        """Step 1's subject as each recipient got it, for a later step without its own."""
        if step.number == 1 or step.subject is not None:
            return {}
        ids = {task_id(campaign_id, t.position, 1): t.position for t in page}
        return {ids[tid]: t.subject for tid, t in self._store.get_tasks(list(ids)).items()}

    def _cancel(self, task: Task, why: str) -> int:
        """Cancel a Pending email whose template fails for its row (1), or 0 when it was
        claimed meanwhile."""
        done = apply_change(self._store, cancel(task, reason=why), at=self._clock.now())
        return int(done is not None)

    # -- add -----------------------------------------------------------------------------------

    def add_step(
        self,
        campaign_id: str,
        *,
        text: str,
        after: Delay | str,
        subject: str | None = None,
        html: str | None = None,
        new_thread: bool = False,
    ) -> StepAdded:
        """Append a step waiting ``after`` (``3d``, ``4h``, ``30m``) after the last one; every
        recipient who finished the sequence without an answer gets it, and a completed
        campaign is reopened. InvalidField names the field (``steps[4].text``); a cancelled
        campaign is refused (IllegalTransition); NotFound."""
        for _ in range(_ATTEMPTS):
            campaign = self._editable(campaign_id)
            number = len(campaign.steps) + 1
            if number > MAX_STEPS:
                raise InvalidField(
                    "steps", len(campaign.steps), f"a sequence has at most {MAX_STEPS} steps"
                )
            delay = (
                after if isinstance(after, Delay) else parse_delay(after, f"steps[{number}].after")
            )
            step = Step(number, subject, text, html, delay, new_thread)
            steps = check_steps([*campaign.steps, step])
            self._check_renders(campaign, None, step)
            if self._replace(campaign, steps):
                return self._reach(campaign_id, step)
        raise Conflict(f"campaign {campaign_id}: its steps kept changing; read them and try again")

    def _reach(self, campaign_id: str, step: Step) -> StepAdded:
        """Make the added step for those who finished the sequence, then reopen a completed
        campaign when anyone got it, as the reconciler's repair does (so a campaign nobody's
        sequence goes on in stays completed, with no second completion logged). The campaign
        is read after the steps were stored: one completed meanwhile is reopened too."""
        now = self._clock.now()
        current = self._store.get_campaign(campaign_id)
        if current.state in (CampaignState.DRAFT, CampaignState.PROVISIONING):
            return StepAdded(campaign_id, step, 0, False)
        completed = current.state is CampaignState.COMPLETED
        going_on = replace(current, state=CampaignState.ACTIVE) if completed else current
        made = self._followups.repair(going_on, now=now)
        reopened = (
            completed
            and made > 0
            and self._store.set_campaign_state(
                campaign_id,
                {CampaignState.COMPLETED},
                CampaignState.ACTIVE,
                at=self._clock.now(),
                reason=f"reopened: step {step.number} added",
            )
        )
        return StepAdded(campaign_id, step, made, reopened)

    # -- shared --------------------------------------------------------------------------------

    def _editable(self, campaign_id: str) -> Campaign:
        campaign = self._store.get_campaign(campaign_id)
        if campaign.state is CampaignState.CANCELLED:
            raise IllegalTransition(
                "campaign", campaign.state.value, "edited", "a cancelled campaign is not edited"
            )
        if not campaign.steps:
            raise InvalidField(
                "steps",
                None,
                "this campaign's emails were written per row at import: it has no step "
                "templates to edit",
            )
        return campaign

    def _check_renders(self, campaign: Campaign, old: Step | None, new: Step) -> None:
        """Compile and render each changed part of ``new`` for the first recipient, alone (so
        a failure names its part); InvalidField ``steps[k].subject``, ``.text`` or ``.html``."""
        try:
            self._renderer.check(new)  # the parts together too: their sizes add up
        except InvalidField as exc:
            part = {"body": "text"}.get(exc.field, exc.field)
            raise InvalidField(
                f"steps[{new.number}].{part}", shown_value(exc.value), exc.reason
            ) from None
        first = self._store.list_recipients(campaign.id, limit=1)
        if not first:
            return
        recipient = first[0]
        probe = replace(campaign, id=f"{campaign.id}#check")
        for part in _PARTS:
            value = getattr(new, part)
            if value is None or (old is not None and getattr(old, part) == value):
                continue
            alone = Step(new.number, "x", "x", None, new.after)
            alone = replace(alone, **{part: value})
            where = f"steps[{new.number}].{part}"
            try:
                out = self._renderer.render(
                    probe, alone, recipient, first_subject=recipient.subject or "x"
                )
            except InvalidField as exc:  # it does not compile
                raise InvalidField(where, shown_value(value), exc.reason) from exc
            if isinstance(out, str):
                raise InvalidField(where, recipient.email, out.partition(": ")[2] or out)

    def _replace(self, campaign: Campaign, steps: tuple[Step, ...]) -> bool:
        """Store ``steps`` if the campaign's are still the ones read, under its lease."""
        with self._replanner.lease(campaign.id, wait=RETRY_LEASE_WAIT) as held:
            if not held:
                raise Conflict(
                    f"campaign {campaign.id} is being re-planned; try the edit again shortly"
                )
            return self._store.replace_steps(
                campaign.id, campaign.steps, steps, at=self._clock.now()
            )


def _step_of(campaign: Campaign, number: object) -> Step:
    if isinstance(number, bool) or not isinstance(number, int):
        raise InvalidField("number", shown_value(number), "a step number: a whole number")
    if not 1 <= number <= len(campaign.steps):
        raise InvalidField("number", number, f"the campaign has steps 1 to {len(campaign.steps)}")
    return campaign.steps[number - 1]


def _changed(
    old: Step, subject: str | Unchanged | None, text: str | Unchanged, html: str | Unchanged | None
) -> Step:
    """``old`` with the parts given changed (Step's checks name ``steps[k].<part>``)."""
    return Step(
        old.number,
        old.subject if isinstance(subject, Unchanged) else subject,
        old.text if isinstance(text, Unchanged) else text,
        old.html if isinstance(html, Unchanged) else html,
        old.after,
        old.new_thread,
    )
