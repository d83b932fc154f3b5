"""Creating a campaign: its recipients from a CSV or from rows, checked whole, then stored with
the campaign as a draft (all or nothing). The CLI, the API and the pages call it; the send path
never does (its controls are :mod:`sendqueue.services.campaigns.controls`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from sendqueue.domain.addresses import normalize_sender
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.lifecycle import StopOnReply
from sendqueue.domain.models import Campaign, Recipient, new_campaign_id
from sendqueue.domain.policy import SendingPolicy
from sendqueue.domain.steps import Step, check_steps
from sendqueue.domain.wording import plural
from sendqueue.ports import Clock, LeasedCampaignTasks
from sendqueue.services.campaigns.controls import check_plannable
from sendqueue.services.config import ServiceConfig
from sendqueue.services.importing.recipients import ImportLimits, Templates
from sendqueue.services.importing.stream import CheckedImport, check_csv, check_rows
from sendqueue.services.senders.service import SenderService
from sendqueue.services.sequences.render import StepRenderer

__all__ = ["CampaignImport", "CreatedCampaign", "Draft"]

log = logging.getLogger(__name__)

MAX_NAME_CHARS = 200


@dataclass(frozen=True)
class CreatedCampaign:
    campaign: Campaign
    imported: CheckedImport


@dataclass(frozen=True)
class Draft:
    """A campaign checked by :meth:`CampaignImport.validate` and not stored: what a preview
    shows and what :meth:`CampaignImport.create` writes."""

    name: str
    from_addr: str
    reply_to: str | None
    imported: CheckedImport
    """Counts and first addresses; the recipients are read again from the source on
    demand, so a stream source must stay open until the draft is created."""
    stop_on_reply: StopOnReply = StopOnReply.SENDER
    unsubscribe_footer: bool = False
    sender_ids: tuple[str, ...] = ()
    """The senders (ids) the recipients are spread across; empty: ``from_addr`` sends."""
    local_time: bool = False
    """Windows read in each recipient's zone (the CSV's ``timezone`` column)."""
    steps: tuple[Step, ...] = ()
    """Its steps as templates: step 1 from the subject and body templates when both are
    given; empty when the rows carry their own subject and text."""


class CampaignImport:
    """Validates and stores new campaigns (see the module docstring)."""

    def __init__(
        self,
        store: LeasedCampaignTasks,
        clock: Clock,
        config: ServiceConfig,
        *,
        senders: SenderService,
    ) -> None:
        self._store = store
        self._clock = clock
        self._config = config
        self._senders = senders

    def validate(
        self,
        *,
        name: str,
        recipients: bytes | str | os.PathLike[str] | BinaryIO | None = None,
        rows: Sequence[Mapping[str, object]] | None = None,
        from_addr: str | None = None,
        reply_to: str | None = None,
        templates: Templates | None = None,
        limits: ImportLimits | None = None,
        stop_on_reply: StopOnReply | str = StopOnReply.SENDER,
        unsubscribe_footer: bool = False,
        senders: Sequence[str] = (),
        local_time: bool = False,
        steps: Sequence[Step] | None = None,
    ) -> Draft:
        """Check a new campaign without writing anything.

        The recipients come either as a CSV (``recipients``: bytes, a path or a binary stream)
        or as mappings (``rows``, see
        :func:`~sendqueue.services.importing.rows.parse_recipient_rows`). ``stop_on_reply`` is a
        :class:`StopOnReply` or its spelling in any case; ``unsubscribe_footer`` a bool;
        ``senders`` names senders by id or address (InvalidField ``senders`` for an unknown
        one); ``local_time`` a bool. ``steps`` makes it a sequence (``domain/steps.py``):
        step 1's templates are then its subject and body, so ``templates`` must not be given
        too; every later step is rendered for the first recipient, so a template that cannot
        render (a missing column) is refused now, naming its step. Raises InvalidField /
        InvalidInput.
        """
        sequence = _sequence(steps, templates)
        if sequence:
            first = sequence[0]
            templates = Templates(subject=first.subject, body=first.text, html=first.html)
        if (recipients is None) == (rows is None):
            raise TypeError("give either recipients (CSV) or rows")
        clean_name = name.strip() if isinstance(name, str) else ""
        if not clean_name:
            raise InvalidField("name", name, "give the campaign a name")
        if len(clean_name) > MAX_NAME_CHARS or any(
            ord(c) < 32 or 0x7F <= ord(c) < 0xA0 or c in "\u2028\u2029" for c in clean_name
        ):
            raise InvalidField(
                "name",
                name,
                f"one line of at most {MAX_NAME_CHARS} characters, without control characters",
            )
        sender = normalize_sender(from_addr or self._config.default_from, "from")
        reply = normalize_sender(reply_to, "reply_to") if reply_to else None
        scope = StopOnReply.parse(stop_on_reply, field="stop_on_reply")
        if not isinstance(unsubscribe_footer, bool):
            raise InvalidField("unsubscribe_footer", unsubscribe_footer, "true or false")
        if not isinstance(local_time, bool):
            raise InvalidField("local_time", local_time, "true or false")
        if isinstance(senders, str):
            senders = [senders]
        sender_ids = self._senders.resolve(list(senders)) if senders else ()
        if rows is not None:
            imported = check_rows(
                rows, templates=templates or Templates(), limits=limits or ImportLimits()
            )
        else:
            assert recipients is not None
            imported = check_csv(
                recipients, templates=templates or Templates(), limits=limits or ImportLimits()
            )
        if not imported.count:
            raise InvalidField("recipients", imported.rows, "the file has no recipient rows")
        if sequence:
            _check_later_steps(sequence, imported)
        return Draft(
            clean_name, sender, reply, imported, scope, unsubscribe_footer, sender_ids, local_time,
            sequence or _first_step(templates),
        )  # fmt: skip

    def create(
        self,
        *,
        name: str,
        recipients: bytes | str | os.PathLike[str] | BinaryIO,
        policy: SendingPolicy,
        from_addr: str | None = None,
        reply_to: str | None = None,
        templates: Templates | None = None,
        limits: ImportLimits | None = None,
        stop_on_reply: StopOnReply | str = StopOnReply.SENDER,
        unsubscribe_footer: bool = False,
        senders: Sequence[str] = (),
        local_time: bool = False,
        steps: Sequence[Step] | None = None,
    ) -> CreatedCampaign:
        """Validate everything, then store the campaign and its recipients whole, as a draft.

        Raises InvalidField / InvalidInput before anything is written.
        """
        draft = self.validate(
            name=name,
            recipients=recipients,
            from_addr=from_addr,
            reply_to=reply_to,
            templates=templates,
            limits=limits,
            stop_on_reply=stop_on_reply,
            unsubscribe_footer=unsubscribe_footer,
            senders=senders,
            local_time=local_time,
            steps=steps,
        )
        return self.create_draft(draft, policy)

    def create_from_rows(
        self,
        *,
        name: str,
        rows: Sequence[Mapping[str, object]],
        policy: SendingPolicy,
        from_addr: str | None = None,
        reply_to: str | None = None,
        templates: Templates | None = None,
        limits: ImportLimits | None = None,
        stop_on_reply: StopOnReply | str = StopOnReply.SENDER,
        unsubscribe_footer: bool = False,
        senders: Sequence[str] = (),
        local_time: bool = False,
        steps: Sequence[Step] | None = None,
    ) -> CreatedCampaign:
        """:meth:`create` with the recipients as mappings (the API's JSON rows)."""
        draft = self.validate(
            name=name,
            rows=rows,
            from_addr=from_addr,
            reply_to=reply_to,
            templates=templates,
            limits=limits,
            stop_on_reply=stop_on_reply,
            unsubscribe_footer=unsubscribe_footer,
            senders=senders,
            local_time=local_time,
            steps=steps,
        )
        return self.create_draft(draft, policy)

    def create_draft(self, draft: Draft, policy: SendingPolicy) -> CreatedCampaign:
        """Store a validated :class:`Draft` with its policy."""
        return self.create_from_recipients(
            name=draft.name,
            recipients=draft.imported.recipients(),
            count=draft.imported.count,
            policy=policy,
            from_addr=draft.from_addr,
            reply_to=draft.reply_to,
            imported=draft.imported,
            stop_on_reply=draft.stop_on_reply,
            unsubscribe_footer=draft.unsubscribe_footer,
            sender_ids=draft.sender_ids,
            local_time=draft.local_time,
            steps=draft.steps,
        )

    def create_from_recipients(
        self,
        *,
        name: str,
        recipients: Iterable[Recipient],
        count: int,
        policy: SendingPolicy,
        from_addr: str,
        reply_to: str | None,
        imported: CheckedImport,
        stop_on_reply: StopOnReply = StopOnReply.SENDER,
        unsubscribe_footer: bool = False,
        sender_ids: tuple[str, ...] = (),
        local_time: bool = False,
        steps: tuple[Step, ...] = (),
    ) -> CreatedCampaign:
        """Store ``count`` recipients, streamed into the store in chunks (all or nothing)."""
        check_plannable(policy, count, now=self._clock.now())
        now = self._clock.now()
        campaign = Campaign(
            id=new_campaign_id(),
            name=name,
            policy=policy,
            from_addr=from_addr,
            reply_to=reply_to,
            recipient_count=count,
            created_at=now,
            updated_at=now,
            stop_on_reply=stop_on_reply,
            unsubscribe_footer=unsubscribe_footer,
            sender_ids=tuple(sender_ids),
            local_time=local_time,
            steps=steps,
        )
        self._store.create_campaign(campaign, recipients)
        stored = self._store.get_campaign(campaign.id)
        log.info("created campaign %s (%s) with %s", campaign.id, name, plural(count, "recipient"))
        return CreatedCampaign(stored, imported)


def _first_step(templates: Templates | None) -> tuple[Step, ...]:
    """Step 1 of a campaign whose subject and body come from templates (kept so that a
    sequence can reply to it and its text can be edited); none when the rows carry them."""
    if templates is None:
        return ()
    subject, body = templates.subject, templates.body
    if subject is None or body is None or not subject.strip() or not body.strip():
        return ()
    html = templates.html if (templates.html or "").strip() else None
    return (Step(1, subject, body, html, None),)


def _sequence(steps: Sequence[Step] | None, templates: Templates | None) -> tuple[Step, ...]:
    """The checked steps of a sequence (none: a campaign of one email from ``templates``)."""
    if steps is None:
        return ()
    checked = check_steps(steps)
    if templates is not None and any((templates.subject, templates.body, templates.html)):
        raise InvalidField(
            "steps", len(checked), "step 1 is in the steps: give no subject or body template too"
        )
    return checked


def _check_later_steps(steps: tuple[Step, ...], imported: CheckedImport) -> None:
    """Render every later step for the first recipient: a template that cannot render for
    the rows' columns is refused before anything is stored, naming its step."""
    first = next(iter(imported.recipients()))
    campaign = Campaign(id="check", name="check", policy=SendingPolicy(), from_addr="x@x.invalid")
    renderer = StepRenderer()
    for step in steps[1:]:
        rendered = renderer.render(campaign, step, first, first_subject=first.subject)
        if isinstance(rendered, str):
            raise InvalidField(f"steps[{step.number}]", first.email, rendered)
