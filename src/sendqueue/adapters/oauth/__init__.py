"""OAuth 2.0 sign-in (``XOAUTH2``) for a sender's SMTP and IMAP: access tokens got with the
sender's refresh token (:mod:`.endpoint`), cached and renewed per sender (:mod:`.tokens`)."""

from __future__ import annotations

from sendqueue.adapters.oauth.endpoint import TIMEOUT, Granted, check_token_url, redeem
from sendqueue.adapters.oauth.tokens import OAuthTokens, SenderToken, renew_margin

__all__ = [
    "TIMEOUT",
    "Granted",
    "OAuthTokens",
    "SenderToken",
    "check_token_url",
    "redeem",
    "renew_margin",
]
