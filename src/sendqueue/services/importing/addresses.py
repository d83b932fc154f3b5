"""Normalizing recipient addresses for the import, each domain checked once per import."""

from __future__ import annotations

import re

from email_validator import validate_email
from email_validator.rfc_constants import CASE_INSENSITIVE_MAILBOX_NAMES

__all__ = ["AddressNormalizer"]

# The shapes of address the fast path takes; anything else goes the full way.
_PLAIN_LOCAL = re.compile(r"[A-Za-z0-9_+-]+(?:\.[A-Za-z0-9_+-]+)*\Z")
_PLAIN_DOMAIN = re.compile(r"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+\Z")
_LOWERCASED_LOCALS = frozenset(CASE_INSENSITIVE_MAILBOX_NAMES)
_MAX_ADDRESS = 254


class AddressNormalizer:
    """email-validator's normalized form of an address, with each domain checked once per import.

    Validating an address costs about 50 us, most of it on the domain (IDNA rules), and a
    recipient list repeats few domains many times. For a plain ASCII address (a dot-atom local
    part of letters, digits and ``_+-.``, a hostname of letters, digits and ``-``) the normalized
    form is the local part as written, ``@``, and the domain's normalized form, so the domain of
    the first valid address that has it is remembered. Everything else (RFC 2142 role names,
    which email-validator lowercases; non-ASCII; quoting; anything too long or invalid) goes
    through :func:`validate_email` whole, so errors carry its messages. A property test holds
    the two paths equal.
    """

    def __init__(self) -> None:
        self._domains: dict[str, str] = {}

    def normalize(self, address: str) -> str:
        """The normalized address; raises ``EmailNotValidError`` as ``validate_email`` does."""
        local, _, domain = address.partition("@")
        plain = (
            _PLAIN_LOCAL.match(local) is not None
            and _PLAIN_DOMAIN.match(domain) is not None
            and local.lower() not in _LOWERCASED_LOCALS
        )
        if plain and (known := self._domains.get(domain)) is not None:
            normalized = f"{local}@{known}"
            # The length checks email-validator makes; the ASCII form is the address as written,
            # up to case, so its length is the first one's.
            if len(address) <= _MAX_ADDRESS and len(normalized.encode("utf-8")) <= _MAX_ADDRESS:
                return normalized
        validated = validate_email(address, check_deliverability=False)
        if plain:
            self._domains[domain] = validated.domain
        return validated.normalized
