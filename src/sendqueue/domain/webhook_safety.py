"""Standard Webhooks signing and the addresses a webhook may reach, without I/O.

Signing (https://www.standardwebhooks.com): the signed content is
``f"{webhook-id}.{webhook-timestamp}.{body}"``, the key the base64-decoded part of the secret
after ``whsec_``, the signature ``v1,`` and the base64 of the HMAC-SHA256. During a rotation a
delivery carries one signature per valid secret, space-separated.

Targets: private, loopback, link-local, unspecified, multicast and reserved addresses (and
IPv4-mapped forms of them) are refused unless the allow-list (``SENDQUEUE_WEBHOOK_ALLOW_HOSTS``:
host names, IPs and CIDRs) names them. The adapter checks both a literal IP and every address
a name resolves to, and connects to the address it checked.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from sendqueue.domain.errors import InvalidField

__all__ = [
    "AllowList",
    "refusal",
    "secret_key",
    "signature_header",
    "signed_headers",
    "verify",
]

_PREFIX = "whsec_"
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@functools.lru_cache(maxsize=256)
def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_`` secret (InvalidField naming ``secret`` otherwise); the
    keys of recent secrets are kept, since every delivery signs with them."""
    if not secret.startswith(_PREFIX):
        raise InvalidField("secret", "whsec_…", "must start with whsec_")
    try:
        return base64.b64decode(secret[len(_PREFIX) :], validate=True)
    except ValueError as exc:
        raise InvalidField("secret", "whsec_…", "must be whsec_ and base64") from exc


def _sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    content = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def signature_header(secrets: Iterable[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """``webhook-signature``: one ``v1,…`` per secret, space-separated."""
    return " ".join(_sign(secret_key(s), msg_id, timestamp, body) for s in secrets)


def signed_headers(
    secrets: Iterable[str], msg_id: str, timestamp: int, body: bytes
) -> dict[str, str]:
    """The headers of one delivery."""
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature_header(secrets, msg_id, timestamp, body),
    }


def verify(secret: str, msg_id: str, timestamp: int, body: bytes, header: str) -> bool:
    """Whether one of the header's signatures is ``secret``'s (constant-time compares)."""
    expected = _sign(secret_key(secret), msg_id, timestamp, body)
    return any(hmac.compare_digest(expected, part) for part in header.split())


@dataclass(frozen=True)
class AllowList:
    """Hosts and networks a webhook may reach although they are not public."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[IpNetwork, ...] = ()

    @classmethod
    def parse(cls, value: str | None, *, field: str = "webhook_allow_hosts") -> AllowList:
        """From ``"receiver.internal, 10.0.0.0/8, 127.0.0.1"`` (InvalidField naming ``field``)."""
        hosts: set[str] = set()
        networks: list[IpNetwork] = []
        for raw in (value or "").split(","):
            item = raw.strip().lower()
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            if "/" in item or any(ch.isspace() for ch in item):
                raise InvalidField(field, raw, "must list host names, IPs or CIDRs")
            hosts.add(item.rstrip("."))
        return cls(frozenset(hosts), tuple(networks))

    def names(self, host: str) -> bool:
        return host.lower().rstrip(".") in self.hosts

    def covers(self, address: IpAddress) -> bool:
        return any(address in network for network in self.networks)


def refusal(host: str, address: str, allow: AllowList) -> str | None:
    """Why ``address`` (``host``'s, or the literal ``host`` itself) may not be reached, or
    None when it may: public, or named by the allow-list (by host or by network)."""
    try:
        ip: IpAddress = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return f"{address!r} is not an IP address"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if allow.names(host) or allow.covers(ip):
        return None
    for kind, flag in (
        ("loopback", ip.is_loopback),
        ("private", ip.is_private),
        ("link-local", ip.is_link_local),
        ("unspecified", ip.is_unspecified),
        ("multicast", ip.is_multicast),
        ("reserved", ip.is_reserved),
        ("not globally reachable", not ip.is_global),
    ):
        if flag:
            return (
                f"{host} resolves to a {kind} address ({ip})"
                if host != str(ip)
                else f"{ip} is a {kind} address"
            )
    return None
