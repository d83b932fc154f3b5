"""The :class:`Probe` ability: a part of the set-up that can be tried for real, without side
effects, by ``sendqueue check``."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["Probe"]


@runtime_checkable
class Probe(Protocol):
    """Something that can be signed in to and out of without changing anything: a mailer
    (connect, EHLO, STARTTLS or TLS, AUTH; no mail sent), a mailbox (sign in, open the folder
    read-only), the public URL (one GET of its health route).

    Contract: ``probe(timeout)`` returns one line saying what answered (no secret in it), or
    raises an :class:`~sendqueue.domain.errors.InfrastructureError` saying why not, or
    :class:`~sendqueue.domain.errors.NotChecked` when the part cannot be tried from here. Each
    network step waits at most ``timeout`` seconds (or the part's own, shorter, timeout). It
    opens its own connection and closes it before returning.
    """

    def probe(self, timeout: float) -> str: ...
