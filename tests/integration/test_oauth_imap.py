"""A sender's mailbox signed in to with OAuth 2.0 (AUTHENTICATE XOAUTH2) on a real Dovecot,
whose oauth2 passdb asks a local token endpoint (tokeninfo) whether the token is current."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sendqueue.adapters.imap import ImapFeedbackSource
from sendqueue.adapters.oauth import OAuthTokens
from sendqueue.domain.errors import FeedbackUnavailable
from sendqueue.domain.senders import OAuthGrant, Sender
from sendqueue.testing import InMemoryTaskStore
from sendqueue.testing.clock import FakeClock
from tests.support.mailservers import Dovecot, dovecot_missing, running_dovecot
from tests.support.oauth import CLIENT_ID, CLIENT_SECRET, TokenEndpoint

MESSAGE = (
    b"From: reader@example.org\r\nTo: news@example.com\r\nSubject: Re: issue 1\r\n"
    b"Message-ID: <r1@example.org>\r\n\r\nthanks\r\n"
)


@pytest.fixture
def oauth_dovecot(mail_root: Path, token_endpoint: TokenEndpoint) -> Iterator[Dovecot]:
    reason = dovecot_missing()
    if reason:
        from tests.conftest import missing

        missing(reason)
    with running_dovecot(mail_root, tokeninfo_url=token_endpoint.tokeninfo_url) as server:
        token_endpoint.user = server.user  # the tokens are the mailbox user's
        yield server


def _sender(endpoint: TokenEndpoint, dovecot: Dovecot, *, user: str | None) -> Sender:
    who = f"{user}@" if user else ""
    return Sender(
        id="s0123456789ab",
        email=f"{dovecot.user}@example.com",
        imap=f"imap://{who}127.0.0.1:{dovecot.port}/INBOX?security=none&timeout=5",
        oauth=OAuthGrant(endpoint.url, CLIENT_ID, "rt-1", CLIENT_SECRET, endpoint.scope),
    )


def _source(sender: Sender) -> tuple[ImapFeedbackSource, InMemoryTaskStore]:
    store = InMemoryTaskStore()
    store.add_sender(sender)
    return ImapFeedbackSource.for_sender(sender, OAuthTokens(store, FakeClock())), store


def test_the_senders_mailbox_is_read_after_signing_in_with_its_token(
    oauth_dovecot: Dovecot, token_endpoint: TokenEndpoint
) -> None:
    oauth_dovecot.deliver(MESSAGE)
    source, _ = _source(_sender(token_endpoint, oauth_dovecot, user=oauth_dovecot.user))
    try:
        _, messages = source.fetch(None)
        got = [m.raw for m in messages]
    finally:
        source.close()

    assert got == [MESSAGE]
    assert token_endpoint.calls == 1
    assert source.name == f"imap://bounces@127.0.0.1:{oauth_dovecot.port}/INBOX"


def test_a_token_the_server_refuses_is_renewed_once(
    oauth_dovecot: Dovecot, token_endpoint: TokenEndpoint
) -> None:
    source, _ = _source(_sender(token_endpoint, oauth_dovecot, user=oauth_dovecot.user))
    try:
        assert "signed in, 0 messages" in source.probe(5)
        token_endpoint.revoke()  # the cached token is no longer current

        assert "signed in, 0 messages" in source.probe(5)
    finally:
        source.close()

    assert token_endpoint.calls == 2


def test_a_revoked_grant_is_unavailable_naming_the_sender_and_no_secret(
    oauth_dovecot: Dovecot, token_endpoint: TokenEndpoint
) -> None:
    token_endpoint.fail_next(400, "invalid_grant", "Token has been expired or revoked.")
    source, _ = _source(_sender(token_endpoint, oauth_dovecot, user=oauth_dovecot.user))

    with pytest.raises(FeedbackUnavailable) as raised:
        source.fetch(None)

    text = str(raised.value)
    assert "oauth" in text and "invalid_grant" in text
    assert "rt-1" not in text and CLIENT_SECRET not in text


def test_another_users_token_is_refused(
    oauth_dovecot: Dovecot, token_endpoint: TokenEndpoint
) -> None:
    sender = _sender(token_endpoint, oauth_dovecot, user=None)  # signs in as its address
    source, _ = _source(sender)

    with pytest.raises(FeedbackUnavailable, match="connecting failed: LoginError"):
        source.fetch(None)

    assert source.name.startswith(f"imap://{sender.email}@")
    assert token_endpoint.calls == 2  # refused, renewed once, refused again
