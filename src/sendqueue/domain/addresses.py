"""Mailboxes and addresses: parsing, normalising, and the Message-ID of a task's email.

Pure functions, shared by the services (a campaign's sender is normalised when it is created)
and the mail adapters (every address is parsed again when a message is built).

Domains travel in their ASCII form, so only a local part ever needs SMTPUTF8. A non-ASCII domain
is converted with IDNA 2008 and the UTS 46 mapping (the ``idna`` package, as email-validator
does), never with Python's ``idna`` codec, which is IDNA 2003: that one maps ``faß.de`` to
``fass.de`` and the final sigma ``ς`` (U+03C2) to the plain one (U+03C3): other domains
than the ones written.
"""

from __future__ import annotations

import email.utils
import functools
import re
from email.headerregistry import Address

import idna
from email_validator import EmailNotValidError, validate_email

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.tokens import TokenPurpose, sign_task, task_id_shape

__all__ = [
    "FALLBACK_DOMAIN",
    "ascii_domain",
    "check_header_value",
    "mailbox_parts",
    "message_id_for",
    "normalize_sender",
    "parse_mailbox",
]

#: The Message-ID domain when the sender's domain is unknown (``.invalid`` is reserved, RFC 2606).
FALLBACK_DOMAIN = "sendqueue.invalid"

_CONTROLS = frozenset({"\x7f", "\u2028", "\u2029"} | {chr(c) for c in range(0x80, 0xA0)})
# The left part of a Message-ID as we produce it: no whitespace, brackets, "@" or specials.
_ID_LEFT = re.compile(r"[^<>@\s\"\\()\[\],;:]+")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_MAX_LABEL = 63
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


def check_header_value(field: str, value: str) -> str:
    """``value`` unchanged, or InvalidField naming ``field`` for CR, LF or another control."""
    if "\r" in value or "\n" in value:
        raise InvalidField(field, value, "a header value may not contain CR or LF")
    # Other controls are no better: Python's email package treats VT, FF, FS..RS, NEL and the
    # Unicode line separators as line breaks too, and RFC 5322 allows none of them.
    bad = next((c for c in value if c in _CONTROLS or (c < " " and c != "\t")), None)
    if bad is not None:
        raise InvalidField(
            field, value, f"a header value may not contain control characters (U+{ord(bad):04X})"
        )
    return value


def ascii_domain(field: str, domain: str, value: str) -> str:
    """The domain in its ASCII form: IDNA 2008 with the UTS 46 mapping for a non-ASCII one.

    An address literal (``[192.0.2.1]``) is returned as it is. Raises InvalidField naming
    ``field`` (and showing ``value``) for a domain that is not a valid hostname, or whose
    labels IDNA 2008 refuses.
    """
    if domain.startswith("[") and domain.endswith("]"):
        return domain
    if domain.isascii():
        encoded = domain
    else:
        try:
            encoded = idna.encode(domain, uts46=True).decode("ascii")
        except idna.IDNAError as exc:
            raise InvalidField(
                field, value, f"the domain {domain!r} is not valid under IDNA 2008: {exc}"
            ) from exc
    labels_fit = all(len(label) <= _MAX_LABEL for label in encoded.split("."))
    if not labels_fit or not _DOMAIN.fullmatch(encoded):
        raise InvalidField(field, value, f"the domain {domain!r} is not valid")
    return encoded


def parse_mailbox(
    field: str, value: str, *, display_name: str | None = None, name_field: str = ""
) -> Address:
    """Parse one mailbox, ``addr`` or ``Name <addr>``, into a header-safe Address (its domain
    in ASCII, see :func:`ascii_domain`). What this accepts, the mail adapters accept as From,
    To or Reply-To.

    ``display_name`` (checked as ``name_field``) replaces a name given in ``value``. Raises
    InvalidField naming ``field``: CR, LF or another control character, not exactly one
    address, anything the parser would have to repair, or a domain IDNA 2008 refuses.
    """
    check_header_value(field, value)
    if display_name is not None:
        check_header_value(name_field or field, display_name)
    _check_unquoted_name(field, value)
    pairs = email.utils.getaddresses([value])
    if len(pairs) != 1:
        raise InvalidField(field, value, "expected exactly one address, e.g. Name <a@example.com>")
    name, addr_spec = pairs[0]
    local, at, domain = addr_spec.rpartition("@")
    # getaddresses quietly repairs what it cannot parse ("a@exa mple.com" -> "a@example.com"):
    # insist that the address it found is written in the value as it is.
    spaced = any(c.isspace() for c in addr_spec)
    if addr_spec not in value or spaced or not at or not local or not domain:
        raise InvalidField(field, value, "expected an address such as Name <a@example.com>")
    return Address(
        display_name=display_name if display_name is not None else name,
        username=local,
        domain=ascii_domain(field, domain, value),
    )


def _check_unquoted_name(field: str, value: str) -> None:
    """Refuse a display name whose ``,`` or ``:`` would change what the parser reads (a second
    address, a group name it drops), rather than send from a name other than the one written."""
    unquoted = _QUOTED.sub('""', value)
    name = unquoted.rpartition("<")[0] if "<" in unquoted else ""
    bad = next((c for c in ",:;" if c in name), None)
    if bad is not None:
        raise InvalidField(
            field, value, f'a display name with "{bad}" must be quoted: "Name" <a@example.com>'
        )


def mailbox_parts(field: str, value: str) -> tuple[str, str]:
    """The display name and the address (as written, domain included) of one mailbox, ``addr``
    or ``Name <addr>``, checked as :func:`parse_mailbox` checks it (InvalidField naming
    ``field``): the structured form a From travels in, so no one formats and parses it again."""
    mailbox = parse_mailbox(field, value)
    address = email.utils.getaddresses([value])[0][1]
    return mailbox.display_name, address


def normalize_sender(value: str, field: str) -> str:
    """``"Name <a@b.example>"`` or ``"a@b.example"``, validated and normalized.

    Refused with InvalidField naming ``field``: line breaks and every other control or line
    separator character, more than one address, anything the mail parser would have to repair
    (it would otherwise send from another address than the one written), and an address that
    email-validator refuses. Internationalised addresses are kept as Unicode (``faß.de`` stays
    ``faß.de``). Whatever this returns, :func:`parse_mailbox` accepts.
    """
    if not isinstance(value, str):
        raise InvalidField(field, value, "expected an address like news@example.com")
    text = value.strip()
    if not text:
        raise InvalidField(field, value, "expected an address like news@example.com")
    if "\r" in text or "\n" in text:
        raise InvalidField(field, value, "must not contain line breaks")
    try:
        mailbox = parse_mailbox(field, text)
        name = mailbox.display_name
        # parse_mailbox gives the ASCII (IDNA) domain; email-validator gives it back as written
        valid = validate_email(f"{mailbox.username}@{mailbox.domain}", check_deliverability=False)
        local, _, domain = valid.normalized.rpartition("@")
        normalized = str(Address(display_name=name, username=local, domain=domain))
        parse_mailbox(field, normalized)
    except InvalidField as exc:
        raise InvalidField(field, value, exc.reason) from None
    except EmailNotValidError as exc:
        raise InvalidField(field, value, str(exc)) from exc
    return normalized


def message_id_for(task_id: str, domain: str, secret: str | None = None) -> str:
    """The Message-ID of the email a task sends: ``<task_id.mac@domain>`` with ``secret``
    (:data:`~sendqueue.domain.tokens.TokenPurpose.MESSAGE_ID`), else ``<task_id@domain>``.

    Derived from the task id alone, so a second delivery of the same task (at-least-once
    execution) carries the same Message-ID and a receiver or an operator can recognise it. The
    MAC makes it unguessable: a reply or a bounce that cites it proves it answers that email
    (:func:`sendqueue.domain.feedback.signed_task_of_message_id`). ``domain`` is the sender's
    domain; a whole address (``Name <a@example.com>``) is accepted too and its domain used. An
    empty or unusable domain falls back to :data:`FALLBACK_DOMAIN`. Raises InvalidField when
    ``task_id`` cannot be a Message-ID's left part (empty, whitespace, brackets, ``@``,
    non-ASCII). An id sendqueue did not make (a store filled by hand) is never signed.
    """
    if not task_id or not task_id.isascii() or not _ID_LEFT.fullmatch(task_id):
        raise InvalidField("task_id", task_id, "must be non-empty ASCII without spaces, <>@")
    left = task_id
    if secret and task_id_shape(task_id):
        left = sign_task(task_id, secret, TokenPurpose.MESSAGE_ID)
    return f"<{left}@{_message_id_domain(domain)}>"


# The sender's domain is the same in every email of a sender: worked out once, not per send.
@functools.lru_cache(maxsize=256)
def _message_id_domain(domain: str) -> str:
    """The right part of :func:`message_id_for` for ``domain`` (a domain or an address)."""
    if "@" in domain:
        pairs = email.utils.getaddresses([domain])
        domain = pairs[0][1].rpartition("@")[2] if len(pairs) == 1 else ""
    domain = domain.strip().rstrip(".")
    try:
        encoded = ascii_domain("domain", domain, domain) if domain else FALLBACK_DOMAIN
    except InvalidField:
        encoded = FALLBACK_DOMAIN
    return encoded.lower()
