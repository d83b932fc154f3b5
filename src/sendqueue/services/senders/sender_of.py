"""Which sender an email goes out from, as templates, pages and the API name it: the task's
sender (read once per sender), or the campaign's From for a campaign without senders.

A sender removed after its emails went out is named by the address the task was planned with
(``Task.sender``), without a name or signature.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress

from sendqueue.domain.errors import NotFound
from sendqueue.domain.models import Campaign, Task
from sendqueue.domain.sender_fields import SenderFields
from sendqueue.domain.senders import Sender
from sendqueue.ports import SenderStore

__all__ = ["SendersOf"]


class SendersOf:
    """The :class:`SenderFields` of one campaign's emails; each sender is read once."""

    def __init__(self, senders: SenderStore | None, campaign: Campaign) -> None:
        self._senders = senders
        self._campaign = campaign
        self._read: dict[str, SenderFields | None] = {}

    @classmethod
    def known(cls, campaign: Campaign, senders: Mapping[str, Sender]) -> SendersOf:
        """From senders read already (a :class:`~sendqueue.domain.reads.TaskListing`'s): an
        id not among them is a removed sender."""
        found = cls(None, campaign)
        found._read = {sid: SenderFields.of_sender(s) for sid, s in senders.items()}
        return found

    def _sender(self, sender_id: str) -> SenderFields | None:
        if sender_id not in self._read:
            if self._senders is None:
                return None
            found = None
            with suppress(NotFound):
                found = SenderFields.of_sender(self._senders.get_sender(sender_id))
            self._read[sender_id] = found
        return self._read[sender_id]

    def of(self, task: Task) -> SenderFields:
        """The sender ``task``'s email goes out from."""
        if task.sender_id is None:
            return SenderFields.of_from(self._campaign.from_addr)
        found = self._sender(task.sender_id)
        return found if found is not None else SenderFields("", task.sender or "")

    def campaign_senders(self) -> list[SenderFields]:
        """The campaign's senders in its order (removed ones left out); empty: its From sends."""
        found = (self._sender(sender_id) for sender_id in self._campaign.sender_ids)
        return [f for f in found if f is not None]
