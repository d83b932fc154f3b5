"""Each sender's OAuth 2.0 access token, cached in memory and renewed ahead of its expiry:
:class:`OAuthTokens` (the :class:`~sendqueue.ports.AccessTokens` port) and its
:class:`SenderToken` per sender.

A token is renewed :func:`renew_margin` before it expires (a minute, or a tenth of a short
lifetime), so a connection signs in with a token that still has time to run. When the
endpoint answers with a new refresh token (Microsoft rotates them), the grant in use takes it
at once and it is saved to the sender store (the sender's other fields as the store has them
then); a save that fails is tried again at the next :meth:`SenderToken.get`. An
``invalid_grant`` reads the stored grant once more before it fails: another process may have
rotated the refresh token first.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

from sendqueue.adapters.oauth.endpoint import Granted, redeem
from sendqueue.domain.errors import InfrastructureError, NotFound, OAuthTokenError
from sendqueue.domain.senders import OAuthGrant, Sender
from sendqueue.ports import Clock, SenderStore

__all__ = ["DEFAULT_LIFETIME", "MAX_LIFETIME", "OAuthTokens", "SenderToken", "renew_margin"]

log = logging.getLogger(__name__)

#: Seconds a token is taken to live when the endpoint says nothing (``expires_in`` is only
#: recommended by RFC 6749); a server that refuses it earlier gets a new one at once.
DEFAULT_LIFETIME = 600.0
#: The longest a token is kept, whatever ``expires_in`` the endpoint gave (a day; providers give
#: an hour or two): a huge or infinite lifetime must neither overflow the clock nor pin a token.
MAX_LIFETIME = 86_400.0
#: The refresh tokens a sender's grant rotated away from that are remembered (as digests), so
#: a stale copy of the sender (the worker caches senders for a moment) is not taken for a
#: grant set anew.
_RETIRED_KEPT = 8

Redeem = Callable[[OAuthGrant, str], Granted]


def renew_margin(lifetime: float) -> float:
    """How long before its expiry a token of ``lifetime`` seconds is renewed: 60 s, or a tenth
    of a lifetime under ten minutes."""
    return min(60.0, lifetime / 10)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class SenderToken:
    """One sender's access token (the :class:`~sendqueue.ports.AccessToken` port). Thread-safe:
    one renewal at a time, which the threads waiting for it then share."""

    def __init__(
        self, sender: Sender, grant: OAuthGrant, store: SenderStore, clock: Clock, redeem: Redeem
    ) -> None:
        self.sender_id = sender.id
        self.user = sender.email
        self._who = f"sender {sender.email}: oauth"
        self._grant = grant
        self._store = store
        self._clock = clock
        self._redeem = redeem
        self._lock = threading.Lock()
        self._token: str | None = None
        self._renew_at: datetime | None = None
        self._retired: deque[str] = deque(maxlen=_RETIRED_KEPT)
        #: The rotated refresh token not saved yet, and the one it replaced.
        self._unsaved: tuple[str, str] | None = None
        #: The grant's permanent refusal, raised again (no request) until the grant changes.
        self._refused: OAuthTokenError | None = None

    def __repr__(self) -> str:
        return f"SenderToken({self.user}, {self._grant.token_url})"

    def observe(self, sender: Sender) -> None:
        """Take the sender as the store has it now: a grant changed there replaces the one in
        use (and its cached token), unless it is an older copy of it (a rotated-away token)."""
        grant = sender.oauth
        if grant is None:
            return
        with self._lock:
            self.user = sender.email
            self._who = f"sender {sender.email}: oauth"
            if grant == self._grant:
                return
            same_client = replace(grant, refresh_token=self._grant.refresh_token) == self._grant
            if same_client and _digest(grant.refresh_token) in self._retired:
                return  # a copy read before the last rotation
            self._grant, self._token, self._renew_at, self._unsaved = grant, None, None, None
            self._refused = None

    def get(self, rejected: str | None = None) -> str:
        """The current access token; a new one when it is due for renewal or is ``rejected``."""
        with self._lock:
            if self._unsaved is not None:
                self._save()
            now = self._clock.now()
            token, due = self._token, self._renew_at
            if token is not None and token != rejected and due is not None and now < due:
                return token
            return self._renew(now)

    def _renew(self, now: datetime) -> str:
        if self._refused is not None and not self._reload():
            # A revoked grant fails every send; asking the endpoint each time would not help.
            raise OAuthTokenError(str(self._refused), permanent=True)
        try:
            granted = self._ask()
        except OAuthTokenError as exc:
            if not exc.permanent or not self._reload():
                raise
            granted = self._ask()
        if granted.refresh_token is not None and granted.refresh_token != self._grant.refresh_token:
            old = self._grant.refresh_token
            self._retired.append(_digest(old))
            self._grant = replace(self._grant, refresh_token=granted.refresh_token)
            self._unsaved = (granted.refresh_token, old)
            self._save()
        lifetime = min(granted.expires_in or DEFAULT_LIFETIME, MAX_LIFETIME)
        self._token = granted.access_token
        self._renew_at = now + timedelta(seconds=lifetime - renew_margin(lifetime))
        return granted.access_token

    def _ask(self) -> Granted:
        """One request; a failure drops the cached token, a permanent one is remembered."""
        try:
            granted = self._redeem(self._grant, self._who)
        except OAuthTokenError as exc:
            self._token, self._refused = None, exc if exc.permanent else None
            raise
        self._refused = None
        return granted

    def _reload(self) -> bool:
        """Whether the stored grant differs from the one in use (another process rotated it, or
        it was set anew); if so it is used from now on."""
        try:
            stored = self._store.get_sender(self.sender_id).oauth
        except (NotFound, InfrastructureError):
            return False
        if stored is None or stored == self._grant:
            return False
        self._retired.append(_digest(self._grant.refresh_token))
        self._grant, self._unsaved, self._refused = stored, None, None
        return True

    def _save(self) -> None:
        """Store the rotated refresh token in the sender as the store has it, unless its grant
        was changed there meanwhile (a grant set by hand wins)."""
        assert self._unsaved is not None
        new, old = self._unsaved
        try:
            stored = self._store.get_sender(self.sender_id)
            if stored.oauth is not None and stored.oauth.refresh_token == old:
                oauth = replace(stored.oauth, refresh_token=new)
                self._store.update_sender(replace(stored, oauth=oauth))
        except NotFound:
            pass  # the sender was removed: nothing to keep the token for
        except InfrastructureError as exc:
            log.warning("%s: the rotated refresh token is not saved yet (%s)", self._who, exc)
            return
        self._unsaved = None


class OAuthTokens:
    """Every sender's :class:`SenderToken`, made at its first use and kept for the process's
    life (the :class:`~sendqueue.ports.AccessTokens` port). ``store`` is where a rotated refresh
    token is saved and a grant read again; ``clock`` times the tokens."""

    def __init__(self, store: SenderStore, clock: Clock, *, exchange: Redeem = redeem) -> None:
        self._store = store
        self._clock = clock
        self._redeem = exchange
        self._lock = threading.Lock()
        self._tokens: dict[str, SenderToken] = {}

    def for_sender(self, sender: Sender) -> SenderToken:
        if sender.oauth is None:
            raise ValueError(f"sender {sender.email} has no oauth grant")
        with self._lock:
            token = self._tokens.get(sender.id)
            if token is None:
                token = SenderToken(sender, sender.oauth, self._store, self._clock, self._redeem)
                self._tokens[sender.id] = token
                return token
        token.observe(sender)
        return token
