"""Each sender's access token (adapters/oauth/tokens.py) with a scripted token endpoint: one
renewal shared by the threads, renewal ahead of expiry, rotated refresh tokens kept and saved,
a grant set anew taking over, another process's rotation picked up."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from sendqueue.adapters.oauth import Granted, OAuthTokens, renew_margin
from sendqueue.adapters.oauth.tokens import MAX_LIFETIME
from sendqueue.domain.errors import OAuthTokenError
from sendqueue.domain.senders import OAuthGrant, Sender
from sendqueue.testing import InMemoryTaskStore
from sendqueue.testing.clock import FakeClock

GRANT = OAuthGrant("https://login.example.com/token", "app", "rt-1", "cs", "scope")
SENDER = Sender(id="s0123456789ab", email="news@example.com", name="News", oauth=GRANT)


class Endpoint:
    """Answers with at-N, rotating the refresh token when told to; records what it was given."""

    def __init__(self, *, rotate: bool = False, expires_in: float | None = 3600) -> None:
        self.rotate = rotate
        self.expires_in = expires_in
        self.valid = "rt-1"
        self.given: list[str] = []
        self.delay = 0.0
        self._lock = threading.Lock()

    def __call__(self, grant: OAuthGrant, who: str) -> Granted:
        time.sleep(self.delay)
        with self._lock:
            self.given.append(grant.refresh_token)
            if grant.refresh_token != self.valid:
                raise OAuthTokenError(f"{who}: invalid_grant", permanent=True)
            n = len(self.given)
            if self.rotate:
                self.valid = f"rt-{n + 1}"
            return Granted(f"at-{n}", self.expires_in, self.valid if self.rotate else None)


def _tokens(endpoint: Endpoint) -> tuple[OAuthTokens, InMemoryTaskStore, FakeClock]:
    store = InMemoryTaskStore()
    store.add_sender(SENDER)
    clock = FakeClock()
    return OAuthTokens(store, clock, exchange=endpoint), store, clock


def test_threads_asking_at_once_share_one_renewal() -> None:
    endpoint = Endpoint()
    endpoint.delay = 0.05
    tokens, _, _ = _tokens(endpoint)
    got: list[str] = []
    threads = [
        threading.Thread(target=lambda: got.append(tokens.for_sender(SENDER).get()))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert got == ["at-1"] * 8
    assert len(endpoint.given) == 1


def test_a_rejected_token_is_renewed_once_however_many_threads_saw_it_refused() -> None:
    endpoint = Endpoint()
    tokens, _, _ = _tokens(endpoint)
    token = tokens.for_sender(SENDER)
    first = token.get()

    assert token.get(rejected=first) == "at-2"
    assert token.get(rejected=first) == "at-2"  # another thread's refusal of the old one
    assert len(endpoint.given) == 2


@pytest.mark.parametrize(("lifetime", "margin"), [(3600, 60), (300, 30), (None, 60)])
def test_a_token_is_renewed_its_margin_before_it_expires(
    lifetime: float | None, margin: float
) -> None:
    endpoint = Endpoint(expires_in=lifetime)
    tokens, _, clock = _tokens(endpoint)
    token = tokens.for_sender(SENDER)
    token.get()
    life = lifetime or 600  # DEFAULT_LIFETIME when the endpoint gives none

    clock.advance(life - margin - 1)
    assert token.get() == "at-1"
    clock.advance(1)
    assert token.get() == "at-2"
    assert renew_margin(life) == margin


def test_a_rotated_refresh_token_is_used_and_saved_and_a_stale_copy_does_not_undo_it() -> None:
    endpoint = Endpoint(rotate=True)
    tokens, store, clock = _tokens(endpoint)
    store.update_sender(replace(SENDER, name="Renamed"))  # changed since the worker read it

    tokens.for_sender(SENDER).get()
    stored = store.get_sender(SENDER.id)
    assert stored.oauth == replace(GRANT, refresh_token="rt-2")
    assert stored.name == "Renamed"  # the store's other fields, not the stale copy's

    clock.advance(3600)
    tokens.for_sender(SENDER).get()  # the worker's cached copy still holds rt-1

    assert endpoint.given == ["rt-1", "rt-2"]
    assert store.get_sender(SENDER.id).oauth == replace(GRANT, refresh_token="rt-3")


def test_a_grant_set_anew_replaces_the_one_in_use_and_its_token() -> None:
    endpoint = Endpoint()
    tokens, _, _ = _tokens(endpoint)
    assert tokens.for_sender(SENDER).get() == "at-1"
    endpoint.valid = "rt-new"

    anew = replace(SENDER, oauth=replace(GRANT, refresh_token="rt-new"))
    assert tokens.for_sender(anew).get() == "at-2"
    assert endpoint.given == ["rt-1", "rt-new"]


def test_invalid_grant_reads_the_stored_grant_once_more() -> None:
    endpoint = Endpoint()
    tokens, store, _ = _tokens(endpoint)
    endpoint.valid = "rt-9"  # another process rotated it, and saved it
    store.update_sender(replace(SENDER, oauth=replace(GRANT, refresh_token="rt-9")))

    assert tokens.for_sender(SENDER).get() == "at-2"
    assert endpoint.given == ["rt-1", "rt-9"]


def test_invalid_grant_with_nothing_new_stored_fails_for_good() -> None:
    endpoint = Endpoint()
    endpoint.valid = "revoked"
    tokens, _, _ = _tokens(endpoint)

    with pytest.raises(OAuthTokenError) as raised:
        tokens.for_sender(SENDER).get()

    assert raised.value.permanent is True
    assert endpoint.given == ["rt-1"]


def test_a_revoked_grant_is_not_asked_again_until_a_new_one_is_set() -> None:
    endpoint = Endpoint()
    endpoint.valid = "revoked"
    tokens, store, _ = _tokens(endpoint)
    with pytest.raises(OAuthTokenError):
        tokens.for_sender(SENDER).get()

    with pytest.raises(OAuthTokenError, match="invalid_grant") as again:
        tokens.for_sender(SENDER).get()  # the next send: the store is read, not the endpoint
    assert again.value.permanent is True
    assert endpoint.given == ["rt-1"]

    endpoint.valid = "rt-new"
    store.update_sender(replace(SENDER, oauth=replace(GRANT, refresh_token="rt-new")))
    assert tokens.for_sender(SENDER).get() == "at-2"


def test_a_rotated_token_the_store_could_not_take_is_saved_at_the_next_call() -> None:
    endpoint = Endpoint(rotate=True)
    tokens, store, _ = _tokens(endpoint)
    store.set_available(False)
    token = tokens.for_sender(SENDER)

    assert token.get() == "at-1"  # the send goes on; the new refresh token is kept in memory
    store.set_available(True)
    assert store.get_sender(SENDER.id).oauth == GRANT

    assert token.get() == "at-1"
    assert store.get_sender(SENDER.id).oauth == replace(GRANT, refresh_token="rt-2")


def test_no_token_in_a_repr_and_a_sender_without_oauth_is_refused() -> None:
    tokens, _, _ = _tokens(Endpoint())
    token = tokens.for_sender(SENDER)
    token.get()

    assert "at-1" not in repr(token) and "rt-1" not in repr(token)
    with pytest.raises(ValueError, match=r"news@example\.com has no oauth"):
        tokens.for_sender(replace(SENDER, oauth=None))


@pytest.mark.parametrize("expires_in", [1e308, float("inf"), 10.0**30])
def test_an_endpoint_s_absurd_lifetime_is_capped_not_a_crash(expires_in: float) -> None:
    endpoint = Endpoint(expires_in=expires_in)
    tokens, _, clock = _tokens(endpoint)
    token = tokens.for_sender(SENDER)

    assert token.get() == "at-1"
    clock.advance(MAX_LIFETIME)
    assert token.get() == "at-2"  # renewed within the cap however long the endpoint said
