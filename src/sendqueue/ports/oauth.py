"""The OAuth 2.0 sign-in ports: a sender's :class:`AccessToken`, and the :class:`AccessTokens`
that hands them out. The SMTP mailer and the IMAP mailbox sign in with ``XOAUTH2`` through
them, never seeing the grant itself."""

from __future__ import annotations

from typing import Protocol

from sendqueue.domain.senders import Sender

__all__ = ["AccessToken", "AccessTokens"]


class AccessToken(Protocol):
    """One sender's current OAuth 2.0 access token.

    Contract: ``get()`` returns a token that has not expired (it may be cached, and is renewed
    ahead of its expiry); ``get(rejected=token)`` says the server refused ``token``, and
    returns a new one unless another thread renewed it already (so a refusal costs one
    renewal, not one per thread). Raises :class:`~sendqueue.domain.errors.OAuthTokenError`
    (``permanent`` or not) naming the sender, never a token. Thread-safe. ``user`` is the
    sender's address, the user to sign in as when a URL names none.
    """

    user: str

    def get(self, rejected: str | None = None) -> str: ...


class AccessTokens(Protocol):
    """Hands out each sender's :class:`AccessToken` (one per sender, shared by its SMTP and
    IMAP sign-ins). ``for_sender`` takes the sender as the store has it now: a grant that
    changed there (a new refresh token set by hand) replaces the one in use. Raises
    ``ValueError`` for a sender without ``oauth``."""

    def for_sender(self, sender: Sender) -> AccessToken: ...
