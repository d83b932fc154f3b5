"""A later step's email for one recipient: its templates rendered with the recipient's row.

Step 1 of every recipient was rendered at import (``services/importing``); a later step is
rendered when it is made, with the same sandbox, the same limits and the same variables: the
row's extra columns, ``email``, ``name`` and ``row``. A step without a subject replies to step
1's rendered subject (``Re: ...``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from sendqueue.domain.addresses import check_header_value
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.models import Campaign, Recipient
from sendqueue.domain.steps import Step, follow_up_subject
from sendqueue.services.templates.render import (
    CompiledTemplates,
    TemplateLimits,
    Templates,
    compile_templates,
)

__all__ = ["StepRenderer"]

#: Steps whose compiled templates are kept (a step's compile costs ~0.2 ms per tag).
_KEPT = 64


class StepRenderer:
    """Renders later steps, each step's templates compiled once per process."""

    def __init__(
        self,
        limits: TemplateLimits | None = None,
        *,
        max_subject_chars: int = 998,
        max_body_chars: int = 1_000_000,
    ) -> None:
        """``limits`` and the longest subject and body are the import's (the composition root
        passes ``ImportLimits``'), so a later step is held to what step 1 was."""
        self._limits = limits or TemplateLimits()
        self._max_subject = max_subject_chars
        self._max_body = max_body_chars
        self._compiled: OrderedDict[tuple[str, int, Step], CompiledTemplates] = OrderedDict()
        # A compiled step holds one row's time budget: the worker's threads render in turn.
        self._lock = threading.Lock()

    def render(
        self, campaign: Campaign, step: Step, recipient: Recipient | None, *, first_subject: str
    ) -> tuple[str, str, str | None] | str:
        """The subject, text and html of ``step`` for ``recipient``, or why it cannot be
        rendered (a template that fails for this row, an output past a limit, a recipient
        whose row is gone)."""
        where = f"step {step.number}"
        if recipient is None:
            return f"{where}: the recipient's row is missing"
        with self._lock:
            return self._render(campaign.id, step, recipient, first_subject, where)

    def check(self, step: Step) -> None:
        """Compile ``step``'s templates together under the limits (a subject and body over
        them together fail though each alone passes); InvalidField naming ``subject``,
        ``body`` or ``html``."""
        compile_templates(Templates(step.subject, step.text, step.html), self._limits)

    def _render(
        self, campaign_id: str, step: Step, recipient: Recipient, first_subject: str, where: str
    ) -> tuple[str, str, str | None] | str:
        try:
            compiled = self._templates(campaign_id, step)
        # stored under larger limits than this process's: the step cannot be made from it
        except InvalidField as exc:
            return f"{where}: template failed: {exc}"
        row: dict[str, object] = {
            **recipient.variables, "email": recipient.email, "name": recipient.name,
        }  # fmt: skip
        if recipient.timezone is not None:
            row["timezone"] = recipient.timezone
        context = {**row, "row": row}
        compiled.start_row()
        try:
            subject = (
                compiled.render("subject", context)
                if compiled.subject is not None
                else follow_up_subject(first_subject)
            )
            text = compiled.render("body", context)
            html = compiled.render("html", context) if compiled.html is not None else None
        # A user's template can raise anything (an undefined name, 1/0, a sandbox refusal):
        # the step is not sent to this recipient, and the task says why.
        except Exception as exc:
            return f"{where}: template failed: {getattr(exc, 'message', None) or exc}"
        finally:
            compiled.end_row()
        return self._checked(where, subject, text, html)

    def _checked(
        self, where: str, subject: str, text: str, html: str | None
    ) -> tuple[str, str, str | None] | str:
        subject = subject.strip()
        if not subject:
            return f"{where}: the subject is empty"
        if len(subject) > self._max_subject:
            return f"{where}: the subject is longer than {self._max_subject} characters"
        try:
            check_header_value("subject", subject)
        except InvalidField as exc:
            return f"{where}: the subject: {exc.reason}"
        for name, part in (("text", text), ("html", html)):
            if part is not None and len(part) > self._max_body:
                return f"{where}: the {name} is longer than {self._max_body} characters"
        return subject, text, html or None

    def _templates(self, campaign_id: str, step: Step) -> CompiledTemplates:
        key = (campaign_id, step.number, step)
        found = self._compiled.get(key)
        if found is None:
            templates = Templates(subject=step.subject, body=step.text, html=step.html)
            found = self._compiled[key] = compile_templates(templates, self._limits)
            if len(self._compiled) > _KEPT:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(key)
        return found
