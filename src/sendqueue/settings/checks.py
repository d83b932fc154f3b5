"""The checks :mod:`sendqueue.settings` applies to single values, and the helpers it exports
(:func:`trusted_networks`, :func:`redact_url`). Each check raises ValueError naming the
variable, never echoing a secret; pydantic reports it as the setting's error."""

from __future__ import annotations

import ipaddress
import math
import re
from urllib.parse import urlsplit, urlunsplit

from sendqueue.domain.addresses import parse_mailbox
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.tokens import MIN_SECRET_LENGTH
from sendqueue.domain.transports import mask_url

__all__ = [
    "MAKE_SECRET",
    "check_bare_address",
    "check_public_url",
    "check_secret_key",
    "check_secret_key_arn",
    "is_host_name",
    "redact_url",
    "refuse_guessable",
    "trusted_networks",
]

_HOST_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")


def is_host_name(name: str) -> bool:
    """A DNS name (labels of letters, digits, "-", "_") or an IP address (IPv6 with or
    without brackets)."""
    try:
        ipaddress.ip_address(name[1:-1] if name.startswith("[") and name.endswith("]") else name)
        return True
    except ValueError:
        pass
    labels = name.lower().removesuffix(".").split(".")
    return len(name) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)


def check_public_url(value: str | None, variable: str) -> str | None:
    """The base URL the links in emails start with (``https://mail.example.com``, a path
    allowed), without its trailing ``/``; None when unset. No user, query or fragment."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises for a port that is not a number in 0..65535
    except ValueError as exc:
        raise ValueError(f"{variable}: not a URL ({exc})") from None
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(
            f"{variable}: expected the https:// address the recipients reach this server at, "
            "e.g. https://mail.example.com"
        )
    if any(ch.isspace() or not ch.isprintable() or ch in '<>"' for ch in value):
        # The link goes between < > in List-Unsubscribe, where a blank or ">" would end it,
        # and into the footer's href="...".
        raise ValueError(
            f'{variable}: no spaces, control characters, <, > or " (percent-encode them)'
        )
    if parts.username is not None or parts.query or parts.fragment:
        raise ValueError(f"{variable}: no user, query or fragment; the links append /u/<token>")
    if not is_host_name(parts.hostname):
        raise ValueError(f"{variable}: {parts.hostname!r} is not a host name")
    return value.rstrip("/")


def check_secret_key(secret: str, variable: str) -> None:
    """A signing key: :data:`~sendqueue.domain.tokens.MIN_SECRET_LENGTH` characters or more,
    and not guessable."""
    if len(secret) < MIN_SECRET_LENGTH:
        raise ValueError(
            f"{variable}: must be at least {MIN_SECRET_LENGTH} characters long; make one with: "
            f"{MAKE_SECRET}"
        )
    refuse_guessable(secret, variable)


#: A Secrets Manager secret's ARN (the name may end in the six characters AWS appends).
_SECRET_ARN = re.compile(
    r"arn:aws[a-zA-Z-]*:secretsmanager:[a-z]{2}(-[a-z]+)+-\d+:\d{12}:secret:[\w/+=.@-]{1,512}"
)


def check_secret_key_arn(value: str | None, variable: str) -> str | None:
    """A Secrets Manager secret's ARN (``arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME``);
    None when unset."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if not _SECRET_ARN.fullmatch(value):
        raise ValueError(
            f"{variable}: expected a Secrets Manager secret ARN, "
            "arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME"
        )
    return value


def check_bare_address(value: str | None, variable: str) -> str | None:
    """A bare address (``unsubscribe@example.com``, no name), its domain in ASCII; None when
    unset."""
    if value is None or not value.strip():
        return None
    try:
        mailbox = parse_mailbox(variable, value.strip())
    except InvalidField as exc:
        raise ValueError(f"{variable}: {exc.reason}") from None
    if mailbox.display_name:
        raise ValueError(f"{variable}: a bare address (unsubscribe@example.com), without a name")
    return mailbox.addr_spec


#: A token must have at least this many distinct characters and this many bits by the
#: estimate length x log2(distinct): a hex token (16 symbols) passes, "aaaa..." does not.
_TOKEN_MIN_DISTINCT = 8
_TOKEN_MIN_BITS = 64


#: How the errors tell to make a key.
MAKE_SECRET = "python -c 'import secrets; print(secrets.token_hex(32))'"


def refuse_guessable(token: str, variable: str) -> None:
    """Raise ValueError naming ``variable`` for a token too easy to guess."""
    distinct = len(set(token))
    bits = len(token) * math.log2(distinct) if distinct > 1 else 0.0
    if distinct < _TOKEN_MIN_DISTINCT or bits < _TOKEN_MIN_BITS:
        raise ValueError(
            f"{variable}: too easy to guess ({distinct} distinct characters, about "
            f"{bits:.0f} bits; at least {_TOKEN_MIN_DISTINCT} and {_TOKEN_MIN_BITS} needed); "
            "make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )


def trusted_networks(
    value: str,
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] | None:
    """The networks of a ``SENDQUEUE_FORWARDED_ALLOW_IPS`` value; None for ``*`` (every peer).

    Raises ValueError naming the first item that is not an IP address or a CIDR network.
    """
    items = [item.strip() for item in value.split(",")]
    if items == ["*"]:
        return None
    networks = []
    for item in items:
        if not item or item == "*":
            raise ValueError(
                "expected IP addresses or CIDR networks separated by commas, or * alone; "
                f"got {value!r}"
            )
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not an IP address or a CIDR network") from None
    return tuple(networks)


def redact_url(url: str, *, path: bool = False) -> str:
    """``url`` with the password replaced by ``***``; with ``path``, also the path and query
    (a webhook URL's path is often its secret)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return mask_url(url)
    if not parts.scheme or not parts.netloc:
        return url
    if url.partition("://")[2].count("@") > parts.netloc.count("@"):
        return mask_url(url)  # a raw / ? # in the password: the parts are not the URL's
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, host = netloc.rpartition("@")
        netloc = f"{userinfo.split(':', 1)[0]}:***@{host}"
    if path:
        return f"{parts.scheme}://{netloc}/***" if parts.path or parts.query else url
    return urlunsplit(parts._replace(netloc=netloc))
