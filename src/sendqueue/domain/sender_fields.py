"""What templates know of the sender an email goes out from: ``sender.name``, ``sender.email``
and ``sender.signature``. Pure, no I/O.

Templates are rendered at import, before provisioning gives each email its sender, so each of
the three renders as a placeholder (:data:`SENDER_PLACEHOLDERS`) that :func:`fill_sender` puts
the task's own sender in place of when the email is sent (or shown). In an HTML part the name
and address are escaped, and the signature is ``signature_html`` when the sender has one, else
the text signature escaped with its line breaks kept (``<br>``). In the subject (a header) the
signature's line breaks become spaces.
"""

from __future__ import annotations

import functools
import html
import re
from dataclasses import dataclass

from .addresses import mailbox_parts
from .errors import InvalidField
from .senders import Sender

__all__ = [
    "SENDER_ATTRIBUTES",
    "SENDER_PLACEHOLDERS",
    "FilledParts",
    "SenderFields",
    "fill_sender",
]

#: The attributes a template may read of ``sender``.
SENDER_ATTRIBUTES = ("name", "email", "signature")

#: What ``{{ sender.ATTR }}`` renders as until :func:`fill_sender`: ASCII that HTML escaping
#: and header checks leave whole, in a form no template or address writes by accident.
SENDER_PLACEHOLDERS = {attr: f"[[sendqueue:sender.{attr}]]" for attr in SENDER_ATTRIBUTES}

_ANY_PLACEHOLDER = re.compile(r"\[\[sendqueue:sender\.(name|email|signature)\]\]")
_MARK = "[[sendqueue:sender."
_LINE_BREAKS = re.compile(r"\s*(?:\r\n|\r|\n)\s*")


@dataclass(frozen=True)
class SenderFields:
    """The sender as templates see it: its display name, address and signature."""

    name: str
    email: str
    signature_text: str = ""
    signature_html: str | None = None

    @property
    def shown(self) -> str:
        """How pages name the sender: ``Name <address>``, or the address alone (text for
        people, escaped by the page; never a header, which the MIME builder writes)."""
        return f"{self.name} <{self.email}>" if self.name else self.email

    @classmethod
    def of_sender(cls, sender: Sender) -> SenderFields:
        return cls(sender.name, sender.email, sender.signature_text, sender.signature_html)

    @classmethod
    def of_from(cls, from_addr: str) -> SenderFields:
        """A campaign without senders: its From's name and address, no signature. A From that
        does not parse (a store filled by hand) is kept whole as the address, for the mail
        adapter to refuse with its own error."""
        if cls is SenderFields:
            return _from_fields(from_addr)
        return cls(*_from_parts(from_addr))


def _from_parts(from_addr: str) -> tuple[str, str]:
    try:
        return mailbox_parts("from_addr", from_addr)
    except InvalidField:
        return "", from_addr


# A campaign's From is the same in every email it sends: parsed once, not once per send.
@functools.lru_cache(maxsize=256)
def _from_fields(from_addr: str) -> SenderFields:
    return SenderFields(*_from_parts(from_addr))


@dataclass(frozen=True)
class FilledParts:
    """An email's subject, text and HTML with its sender in place."""

    subject: str
    text: str
    html: str | None


def fill_sender(
    subject: str, text: str, html_part: str | None, fields: SenderFields
) -> FilledParts:
    """Put ``fields`` where the templates rendered :data:`SENDER_PLACEHOLDERS`, each part in
    its own form (see the module docstring). One pass per part, so a value that happens to
    hold a placeholder is never filled in again."""
    if not any(_MARK in part for part in (subject, text, html_part or "")):
        return FilledParts(subject, text, html_part)  # nothing to fill: skip the escaping
    one_line = _LINE_BREAKS.sub(" ", fields.signature_text).strip()
    plain = {"name": fields.name, "email": fields.email, "signature": fields.signature_text}
    header = {**plain, "signature": one_line}
    signature_html = fields.signature_html
    if signature_html is None:
        signature_html = html.escape(fields.signature_text).replace("\n", "<br>\n")
    marked = {
        "name": html.escape(fields.name),
        "email": html.escape(fields.email),
        "signature": signature_html,
    }
    return FilledParts(
        subject=_fill(subject, header),
        text=_fill(text, plain),
        html=None if html_part is None else _fill(html_part, marked),
    )


def _fill(part: str, values: dict[str, str]) -> str:
    if _MARK not in part:
        return part
    return _ANY_PLACEHOLDER.sub(lambda m: values[m.group(1)], part)
