"""Signed task tokens: the unsubscribe link's token, the VERP bounce address and the Message-ID.

A token is ``<task id>.<mac>``: the task id in clear, so a lookup needs no table, and the first
32 hex digits (128 bits) of HMAC-SHA256 over a purpose and the task id, keyed by
``SENDQUEUE_SECRET_KEY``. The purpose keeps an unsubscribe token from working as a bounce
address, a Message-ID from working as either, and so on. Everything is lower-case
``[0-9a-z.-]``, so the token survives a mail system that folds the case of a local part. Pure,
no I/O.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re

from sendqueue.domain.errors import InvalidField

__all__ = [
    "MIN_SECRET_LENGTH",
    "TASK_ID_PATTERN",
    "TokenPurpose",
    "sign_task",
    "task_id_shape",
    "verify_task",
    "verp_address",
    "verp_task",
]

#: Shortest secret key accepted (characters): 32 gives 128 bits from a random hex key.
MIN_SECRET_LENGTH = 32

_MAC_HEX = 32
#: The ids sendqueue makes (``models.task_id``): ``c<12 hex>-<position>``, and ``-s<step>``
#: after it for a later step of a sequence (2 to 10).
TASK_ID_PATTERN = r"c[0-9a-f]{12}-[0-9]{1,9}(?:-s(?:[2-9]|10))?"
_TOKEN = re.compile(rf"({TASK_ID_PATTERN})\.([0-9a-f]{{32}})")
_TASK_ID = re.compile(TASK_ID_PATTERN)


class TokenPurpose(enum.StrEnum):
    """What a token may be used for."""

    UNSUBSCRIBE = "unsubscribe"
    BOUNCE = "bounce"
    MESSAGE_ID = "message-id"


def task_id_shape(task_id: str) -> bool:
    """Whether ``task_id`` is shaped like an id sendqueue makes (and so can be signed)."""
    return _TASK_ID.fullmatch(task_id) is not None


def _mac(secret: str, purpose: TokenPurpose, task_id: str) -> str:
    digest = hmac.new(secret.encode(), f"{purpose.value}:{task_id}".encode(), hashlib.sha256)
    return digest.hexdigest()[:_MAC_HEX]


def _check_secret(secret: str) -> None:
    if len(secret) < MIN_SECRET_LENGTH:
        raise InvalidField("secret_key", "***", f"at least {MIN_SECRET_LENGTH} characters")


def sign_task(task_id: str, secret: str, purpose: TokenPurpose) -> str:
    """The token of ``task_id`` for ``purpose``: ``<task id>.<32 hex digits>``."""
    _check_secret(secret)
    token = f"{task_id}.{_mac(secret, purpose, task_id)}"
    if not _TOKEN.fullmatch(token):
        raise InvalidField("task_id", task_id, "not a task id sendqueue made")
    return token


def verify_task(token: str, secret: str, purpose: TokenPurpose) -> str | None:
    """The task id of a genuine ``token`` for ``purpose``; None for a forged, altered or
    malformed one (compared in constant time)."""
    _check_secret(secret)
    match = _TOKEN.fullmatch(token.strip().lower()) if isinstance(token, str) else None
    if match is None:
        return None
    task_id, mac = match.groups()
    if not hmac.compare_digest(mac, _mac(secret, purpose, task_id)):
        return None
    return task_id


def verp_address(bounce_address: str, task_id: str, secret: str) -> str:
    """The envelope sender of a task's email: ``bounces@example.com`` becomes
    ``bounces+<token>@example.com``, so a DSN names its task even when the returned headers
    are cut."""
    local, at, domain = bounce_address.rpartition("@")
    if not at or not local or not domain:
        raise InvalidField("bounce_address", bounce_address, "expected bounces@example.com")
    return f"{local}+{sign_task(task_id, secret, TokenPurpose.BOUNCE)}@{domain}"


def verp_task(address: str, bounce_address: str, secret: str) -> str | None:
    """The task id a VERP address of ``bounce_address`` names (checked), or None for any other
    address."""
    local, _, domain = address.strip().strip("<>").rpartition("@")
    base_local, _, base_domain = bounce_address.rpartition("@")
    if domain.lower() != base_domain.lower():
        return None
    prefix = base_local.lower() + "+"
    if not local.lower().startswith(prefix):
        return None
    return verify_task(local[len(prefix) :], secret, TokenPurpose.BOUNCE)
