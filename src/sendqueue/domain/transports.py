"""The rules a transport (a mailer or an IMAP mailbox URL) must follow, and the one way a URL
holding credentials is shown. Pure: the adapters parse the URLs and ask these rules.

- :func:`mask_url` never shows a password, whatever it holds: a URL that cannot be read
  cleanly (a raw ``/``, ``?``, ``#`` or ``@`` in its user or password) shows nothing between
  ``://`` and its last ``@``.
- :class:`TransportRules`: in production no ``maildir:`` transport (it delivers nothing); never
  a password in plain text to a host other than this machine; and, when an allow-list is set
  (``SENDQUEUE_TRANSPORT_HOSTS``), no host outside it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from .errors import InvalidField

__all__ = ["TransportRules", "host_allowed", "is_loopback", "mask_url", "parse_host_patterns"]

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})


def mask_url(url: str) -> str:
    """``url`` as it may be shown: the password replaced by ``***`` (``smtp://user:***@host``)
    and the query and fragment left out (a provider may take a key there). When the user and
    password cannot be told apart from the rest, everything up to the last ``@`` is ``***``."""
    head, sep, rest = url.partition("://")
    if not sep:  # ses:REGION, maildir:PATH; an "@" there could only be a mistyped smtp: URL
        shown = url.split("?", 1)[0].split("#", 1)[0]
        scheme = url.split(":", 1)[0]
        return f"{scheme}:***@{shown.rpartition('@')[2]}" if "@" in shown else shown
    if "@" not in rest:
        after = rest.split("#", 1)[0].split("?", 1)[0]
        authority = after.split("/", 1)[0]
        _, colon, port = authority.rpartition(":")
        if colon and not authority.startswith("[") and not port.isdigit():
            # "user:secret/host" without its "@": what follows the colon may be a password
            after = "***" + after[len(authority) :]
        return f"{head}://{after}"
    userinfo, _, after = rest.rpartition("@")
    if any(ch in userinfo for ch in "/?#"):
        prefix = "***@"
    else:
        user, colon, _ = userinfo.partition(":")
        prefix = f"{user}:***@" if colon else f"{user}@"
    return f"{head}://{prefix}{after.split('#', 1)[0].split('?', 1)[0]}"


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine: ``localhost`` or a loopback address."""
    name = host.strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def parse_host_patterns(text: str, field: str) -> tuple[str, ...]:
    """Comma-separated host names or ``*.example.com`` patterns, lower-cased; InvalidField
    naming ``field`` for an item that is neither (an empty text: no patterns)."""
    patterns: list[str] = []
    for item in (part.strip().lower() for part in text.split(",")):
        if not item:
            continue
        name = item[2:] if item.startswith("*.") else item
        labels = name.removesuffix(".").split(".")
        bad = not name or any(
            not label or len(label) > 63 or not all(c.isalnum() or c in "-_:[]" for c in label)
            for label in labels
        )
        if bad or "*" in name:
            raise InvalidField(
                field, item[:100], "expected host names or patterns such as *.example.com"
            )
        patterns.append(item.removesuffix("."))
    return tuple(patterns)


def host_allowed(host: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``host`` matches one of ``patterns`` (no patterns: every host). ``*.example.com``
    matches the names under example.com, not example.com itself."""
    if not patterns:
        return True
    name = host.strip("[]").lower().removesuffix(".")
    for pattern in patterns:
        pattern = pattern.strip("[]")
        if pattern.startswith("*."):
            if name.endswith(pattern[1:]) and len(name) > len(pattern) - 1:
                return True
        elif name == pattern:
            return True
    return False


@dataclass(frozen=True)
class TransportRules:
    """What a transport may be here. ``production``: ``SENDQUEUE_ENVIRONMENT=production``;
    ``hosts``: the allow-list's patterns (empty: any host)."""

    production: bool = False
    hosts: tuple[str, ...] = ()

    def check_maildir(self, field: str, shown: str) -> None:
        """A ``maildir:`` transport writes files and delivers nothing: not in production."""
        if self.production:
            raise InvalidField(
                field,
                shown,
                "a maildir: transport delivers nothing (it writes files); use smtp:// or ses: "
                "when SENDQUEUE_ENVIRONMENT=production",
            )

    def check_host(
        self, field: str, shown: str, host: str, *, port: int, password: bool, encrypted: bool
    ) -> None:
        """A network transport to ``host``: refused when it would send a password unencrypted
        to another machine, or when the host is outside the allow-list."""
        where = f"{host}:{port}"
        if password and not encrypted and not is_loopback(host):
            raise InvalidField(
                field,
                shown,
                f"refusing to send a password unencrypted to {where}; use security=starttls "
                "or security=tls (plain text only to this machine)",
            )
        if not host_allowed(host, self.hosts):
            raise InvalidField(
                field,
                shown,
                f"the host {host} is not in SENDQUEUE_TRANSPORT_HOSTS ({', '.join(self.hosts)})",
            )
