"""Every sender's own mailbox (``Sender.imap``), as the feedback poller reads it and the views
show it.

:meth:`SenderMailboxes.current` reads the senders from the store at each call (the poller calls
it at every pass), so a sender added, changed or removed is picked up without a restart. Each
mailbox is named, for its cursor, its lease and its state, by its sender's id and its address
without the password (:func:`sender_mailbox_key`: ``sender:<id>:imap://user@host:port/folder``):
a changed password keeps the cursor, a changed host, port, user or folder starts a new one.

The sources are built by one factory the composition root hands in (``open_source``, where a
sign-in other than the URL's password is plugged in); building one opens nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.feedback import MailboxState
from sendqueue.domain.senders import Sender, masked_transport
from sendqueue.ports import FeedbackCursors, FeedbackSource, SenderStore

__all__ = [
    "PolledMailbox",
    "SenderMailboxes",
    "mailbox_dict",
    "mask_secrets",
    "sender_mailbox_key",
    "url_secrets",
]

#: What replaces a secret in an error kept or shown.
MASK = "***"


def sender_mailbox_key(sender_id: str, name: str | None) -> str:
    """The cursor, lease and state name of a sender's mailbox ``name`` (its URL without the
    password); ``sender:<id>`` alone for a URL no source could be made of."""
    return f"sender:{sender_id}:{name}" if name else f"sender:{sender_id}"


def mask_secrets(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every one of ``secrets`` (longest first) replaced by ``***``."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def mailbox_dict(state: MailboxState) -> dict[str, object]:
    """A mailbox's state as ``sender show --json`` and the API show it (times in ISO 8601)."""
    return {
        "mailbox": state.mailbox,
        "polled_at": state.polled_at.isoformat() if state.polled_at else None,
        "messages_read": state.messages_read,
        "last_error": state.last_error,
    }


@dataclass(frozen=True)
class PolledMailbox:
    """One mailbox of a pass. ``key`` names its cursor, lease and state; ``source`` reads it
    (None when none could be made of its URL: ``error`` says why); ``sender_id`` is the sender
    it belongs to (None: the feedback mailbox); ``secrets`` are masked out of its errors."""

    key: str
    source: FeedbackSource | None
    sender_id: str | None = None
    error: str | None = None
    secrets: tuple[str, ...] = ()


def _echoed_forms(secret: str) -> set[str]:
    """``secret`` as a server's error may give it back: as it is, quoted as IMAP sends it (a
    backslash before each backslash and double quote), and each of those as a Python bytes
    repr writes it (the IMAP library quotes the server's reply that way: backslashes doubled
    again, single quotes escaped or not, non-ASCII as hex escapes)."""
    forms = {secret, secret.replace("\\", "\\\\").replace('"', '\\"')}
    for form in list(forms):
        escaped = repr(form.encode("utf-8", "surrogatepass") + b"'\"")[2:-4]
        forms |= {escaped, escaped.replace("\\'", "'")}
    return forms


def url_secrets(url: str | None, *more: str | None) -> tuple[str, ...]:
    """The password of a mailbox ``url`` (as given and percent-decoded) and ``more`` secrets,
    in every form a server's error may echo them in (:func:`_echoed_forms`), for
    :func:`mask_secrets`."""
    found: list[str | None] = list(more)
    try:
        password = urlsplit(url or "").password
    except ValueError:
        password = None
    if password:
        found += [password, unquote(password)]
    return tuple(sorted({form for s in found if s for form in _echoed_forms(s)}))


def _secrets_of(sender: Sender) -> tuple[str, ...]:
    """The sender's mailbox password and OAuth secrets (:func:`url_secrets`)."""
    grant = sender.oauth
    if grant is None:
        return url_secrets(sender.imap)
    return url_secrets(sender.imap, grant.refresh_token, grant.client_secret)


def _shown(url: str) -> str:
    """A URL no source could be made of, as shown: its password masked."""
    try:
        return masked_transport(url) or ""
    except ValueError:  # not even a URL urlsplit can read
        return MASK


class SenderMailboxes:
    """The senders' mailboxes (see the module docstring)."""

    def __init__(
        self,
        senders: SenderStore,
        states: FeedbackCursors,
        open_source: Callable[[Sender], FeedbackSource],
    ) -> None:
        self._senders = senders
        self._states = states
        self._open = open_source

    def current(self) -> list[PolledMailbox]:
        """The mailbox of every sender that has one, as the store has the senders now."""
        return [self.mailbox_of(s) for s in self._senders.list_senders() if s.imap is not None]

    def mailbox_of(self, sender: Sender) -> PolledMailbox:
        """The sender's mailbox (its ``imap`` must be set). A URL no source can be made of
        gives a mailbox without a source, whose error names the field ``imap``."""
        secrets = _secrets_of(sender)
        try:
            source = self._open(sender)
        except InvalidField as exc:
            error = mask_secrets(f"imap: {exc.reason}", secrets)
            return PolledMailbox(sender_mailbox_key(sender.id, None), None, sender.id, error)
        return PolledMailbox(
            sender_mailbox_key(sender.id, source.name), source, sender.id, secrets=secrets
        )

    def states_of(self, senders: Collection[Sender]) -> dict[str, MailboxState]:
        """Sender id -> its mailbox's state, for those of ``senders`` that have a mailbox (one
        never polled yet: no time, no messages, no error). ``mailbox`` is its URL without the
        password."""
        shown: dict[str, tuple[str, str]] = {}
        for sender in senders:
            if sender.imap is None:
                continue
            box = self.mailbox_of(sender)
            if box.source is not None:
                name = box.source.name
                box.source.close()
            else:
                name = _shown(sender.imap)
            shown[sender.id] = (box.key, name)
        kept = self._states.mailbox_states([key for key, _ in shown.values()])
        out: dict[str, MailboxState] = {}
        for sender_id, (key, name) in shown.items():
            state = kept.get(key, MailboxState(key))
            out[sender_id] = MailboxState(
                name, state.polled_at, state.messages_read, state.last_error
            )
        return out
