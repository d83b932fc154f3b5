"""Whether a received message's From is authenticated, by its ``Authentication-Results``.

A reply may stop a recipient's emails only when it is proven to come from that recipient. One
proof is the ``Authentication-Results`` header (RFC 8601) that the receiving mail server wrote:
``dmarc=pass header.from=<the From's domain>``, or a ``dkim=pass`` whose signing domain
(``header.d``, else the domain of ``header.i``) or an ``spf=pass`` whose ``smtp.mailfrom``
domain is aligned with the From's domain (the same domain, or the From's domain below it, as
DMARC's relaxed alignment allows without a public-suffix list).

Anyone can write such a header into a message they send, so only headers whose authserv-id is
one the operator configured (``SENDQUEUE_TRUSTED_AUTHSERV``) are read, and of those only the
topmost per authserv-id: the receiving server prepends its own, and RFC 8601 section 5 asks it
to remove any that claim its id on arrival. Microsoft 365 writes no authserv-id, so its header
cannot be trusted. The header is parsed with ``authres``. Pure, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from email.message import Message

import authres

from sendqueue.domain.mailparts import addresses, raw_headers_of

__all__ = ["MAX_RESULTS_HEADER", "from_is_authenticated"]

#: Longest Authentication-Results value read (characters); a real one with DKIM's ``b=`` is
#: one or two kilobytes.
MAX_RESULTS_HEADER = 8192
#: Authentication-Results headers looked at (the trusted server's own are at the top).
_MAX_HEADERS = 20
# The authserv-id, the header value's first word (RFC 8601 section 2.2), read without a parse.
_AUTHSERV = re.compile(r"\s*([^\s;()]+)")
_PARSE_ERRORS = (authres.core.AuthResError, RecursionError, ValueError, IndexError, TypeError)


def from_is_authenticated(msg: Message, trusted: Collection[str]) -> bool:
    """Whether a trusted server's ``Authentication-Results`` says ``msg``'s From domain passes
    DMARC, aligned DKIM or aligned SPF (see the module's docstring). False without exactly one
    From address, or without any ``trusted`` authserv-id.

    Fails closed: the topmost header of a trusted server is the only one read for it, even
    when it is too long or does not parse (then that server authenticates nothing), so an
    attacker who makes the genuine header unreadable does not promote a forged one below it.
    Structured values are read as written, never RFC 2047-decoded."""
    wanted = {t.strip().lower() for t in trusted if t.strip()}
    if not wanted:
        return False
    domain = _single_from_domain(msg)
    if domain is None:
        return False
    seen: set[str] = set()
    for value in raw_headers_of(msg, "authentication-results")[:_MAX_HEADERS]:
        server = _AUTHSERV.match(value)
        name = server.group(1).lower() if server else ""
        if name not in wanted or name in seen:
            continue
        seen.add(name)  # only the topmost header of each trusted server counts, read or not
        parsed = _parse(value)
        if parsed is not None and any(_passes(result, domain) for result in parsed.results):
            return True
    return False


def _single_from_domain(msg: Message) -> str | None:
    """The domain of the one From address, read from the header as written; None for none,
    several, or a value the address parser would have to repair (unbalanced brackets or
    comments)."""
    values = raw_headers_of(msg, "from")
    if len(values) != 1:
        return None
    value = values[0]
    if value.count("<") != value.count(">") or value.count("(") != value.count(")"):
        return None
    found = addresses(values)[:2]
    if len(found) != 1 or found[0] not in value:
        return None
    return found[0].rpartition("@")[2].lower().rstrip(".")


def _parse(value: str) -> authres.AuthenticationResultsHeader | None:
    if len(value) > MAX_RESULTS_HEADER:
        return None
    try:
        return authres.AuthenticationResultsHeader.parse_value(value)
    except _PARSE_ERRORS:
        return None


def _property(result: object, ptype: str, name: str) -> str:
    for prop in getattr(result, "properties", ()):
        if str(prop.type).lower() == ptype and str(prop.name).lower() == name:
            return str(prop.value or "").strip().strip("<>").lower()
    return ""


def _aligned(candidate: str, domain: str) -> bool:
    """``domain`` is ``candidate`` or below it (relaxed alignment); a bare TLD never aligns."""
    candidate = candidate.rpartition("@")[2].rstrip(".")
    if not candidate or "." not in candidate:
        return False
    return domain == candidate or domain.endswith("." + candidate)


def _passes(result: object, domain: str) -> bool:
    method = str(getattr(result, "method", "")).lower()
    if str(getattr(result, "result", "")).lower() != "pass":
        return False
    if method == "dmarc":
        return _property(result, "header", "from").rpartition("@")[2] == domain
    if method == "dkim":
        signer = _property(result, "header", "d") or _property(result, "header", "i")
        return _aligned(signer, domain)
    if method == "spf":
        return _aligned(_property(result, "smtp", "mailfrom"), domain)
    return False
