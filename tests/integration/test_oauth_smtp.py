"""SMTP sign-in with OAuth 2.0 (XOAUTH2) against real parts on loopback: a token endpoint
(http.server) and aiosmtpd taking only the endpoint's current access token. A sender with
``oauth`` sends through :class:`SenderMailers`, as the worker does."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from sendqueue.adapters.mail.factory import SenderMailers
from sendqueue.adapters.oauth import OAuthTokens
from sendqueue.domain.errors import PermanentMailError, TransientMailError
from sendqueue.domain.senders import OAuthGrant, Sender
from sendqueue.domain.transports import TransportRules
from sendqueue.ports import Mailer, OutgoingMessage, Probe
from sendqueue.testing import InMemoryTaskStore
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from tests.support.oauth import CLIENT_ID, CLIENT_SECRET, TokenEndpoint, XOAuth2Smtp
from tests.support.smtp import SmtpSink

SENT_AT = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


def _message(n: int = 1) -> OutgoingMessage:
    return OutgoingMessage(
        message_id=f"<m{n}@example.com>",
        from_addr="Example News <news@example.com>",
        to_addr="reader@example.org",
        subject=f"issue {n}",
        text="hello\n",
        date=SENT_AT,
    )


class World:
    """A store with one sender signing in with OAuth, its tokens and its mailers."""

    def __init__(self, endpoint: TokenEndpoint, smtp: XOAuth2Smtp) -> None:
        self.endpoint = endpoint
        self.smtp = smtp
        self.clock = FakeClock(SENT_AT)
        self.store = InMemoryTaskStore()
        grant = OAuthGrant(
            token_url=endpoint.url,
            client_id=CLIENT_ID,
            refresh_token="rt-1",
            client_secret=CLIENT_SECRET,
            scope=endpoint.scope,
        )
        self.sender = Sender(
            id="s0123456789ab",
            email="news@example.com",
            name="Example News",
            transport=smtp.url(),
            oauth=grant,
        )
        self.store.add_sender(self.sender)
        self.tokens = OAuthTokens(self.store, self.clock)
        self.mailers = SenderMailers(
            RecordingMailer, "maildir:/nonexistent", self.tokens, TransportRules()
        )

    def mailer(self) -> Mailer:
        """The sender's mailer, as the worker gets it (the sender as the store has it)."""
        return self.mailers.for_sender(self.store.get_sender(self.sender.id))

    def send(self, n: int = 1) -> None:
        """Send on a new connection (each sign-in is what these tests are about)."""
        mailer = self.mailer()
        try:
            mailer.send(_message(n))
        finally:
            mailer.close()


@pytest.fixture
def world(token_endpoint: TokenEndpoint, xoauth2_smtp: XOAuth2Smtp) -> Iterator[World]:
    w = World(token_endpoint, xoauth2_smtp)
    yield w
    w.mailers.close()


def test_a_sender_with_oauth_signs_in_with_xoauth2_and_its_email_is_delivered(
    world: World,
) -> None:
    world.send()

    assert [m["Subject"] for m in world.smtp.messages] == ["issue 1"]
    assert world.smtp.attempts == ["ok"]  # user = the sender's address, the current token
    assert world.endpoint.calls == 1
    assert world.endpoint.forms[0]["grant_type"] == "refresh_token"


def test_the_url_user_signs_in_when_the_transport_names_one(world: World) -> None:
    world.endpoint.user = "mailbox@example.com"
    transport = world.smtp.url("mailbox@example.com")
    world.store.update_sender(replace(world.sender, transport=transport))

    world.send()

    assert world.smtp.attempts == ["ok"]


def test_a_token_is_reused_until_shortly_before_it_expires_then_renewed(world: World) -> None:
    world.send(1)
    world.clock.advance(3600 - 61)
    world.send(2)
    assert world.endpoint.calls == 1  # the cached token, still valid for 61 s

    world.clock.advance(2)  # within the last minute: renewed before use, never refused
    world.send(3)

    assert world.endpoint.calls == 2
    assert world.smtp.attempts == ["ok", "ok", "ok"]
    assert len(world.smtp.messages) == 3


def test_a_refused_token_is_renewed_once_and_the_email_goes_out(world: World) -> None:
    world.send(1)
    world.endpoint.revoke()  # the server no longer takes the cached token

    world.send(2)

    assert world.smtp.attempts == ["ok", "refused", "ok"]
    assert world.endpoint.calls == 2
    assert len(world.smtp.messages) == 2


def test_a_token_refused_twice_fails_the_send_for_good(world: World) -> None:
    world.endpoint.user = "someone-else@example.com"  # the server takes no token of this sender

    with pytest.raises(PermanentMailError, match="AUTH XOAUTH2 failed: 535") as raised:
        world.send()

    assert world.smtp.attempts == ["refused", "refused"]  # a new token tried once
    assert world.endpoint.calls == 2
    assert "at-" not in str(raised.value)


def test_a_rotated_refresh_token_is_saved_with_the_senders_other_fields(world: World) -> None:
    world.endpoint.rotate = True

    world.send(1)

    stored = world.store.get_sender(world.sender.id)
    assert stored.oauth is not None and stored.oauth.refresh_token == "rt-2"
    assert replace(stored, oauth=world.sender.oauth) == world.sender

    world.clock.advance(3600)  # the next renewal posts the rotated token, and saves the next
    world.send(2)

    assert world.endpoint.forms[1]["refresh_token"] == "rt-2"
    stored = world.store.get_sender(world.sender.id)
    assert stored.oauth is not None and stored.oauth.refresh_token == "rt-3"
    assert len(world.smtp.messages) == 2


def test_invalid_grant_fails_the_send_permanently_naming_the_sender_and_no_secret(
    world: World,
) -> None:
    world.endpoint.fail_next(
        400, "invalid_grant", "AADSTS70008: The refresh token rt-1 has expired due to inactivity."
    )

    with pytest.raises(PermanentMailError) as raised:
        world.send()

    text = str(raised.value)
    assert "sender news@example.com: oauth" in text
    assert "invalid_grant: AADSTS70008" in text
    assert "set a new one (oauth)" in text
    assert "rt-1" not in text and CLIENT_SECRET not in text
    assert world.smtp.messages == [] and world.smtp.attempts == []


@pytest.mark.parametrize(
    ("status", "error"),
    [(503, "temporarily_unavailable"), (502, None), (429, "slow_down")],
)
def test_an_endpoint_that_is_down_fails_the_send_for_now(
    world: World, status: int, error: str | None
) -> None:
    world.endpoint.fail_next(status, error)

    with pytest.raises(TransientMailError, match=f"HTTP {status}"):
        world.send(1)
    world.send(2)  # the next try gets its token

    assert [m["Subject"] for m in world.smtp.messages] == ["issue 2"]


def test_a_grant_set_anew_in_the_store_replaces_the_one_in_use(world: World) -> None:
    world.send(1)
    world.endpoint.refresh_token = "rt-new"  # the operator signed in again...
    assert world.sender.oauth is not None
    grant = replace(world.sender.oauth, refresh_token="rt-new")
    world.store.update_sender(replace(world.sender, oauth=grant))  # ...and set it
    world.endpoint.revoke()

    world.send(2)

    assert world.endpoint.forms[-1]["refresh_token"] == "rt-new"
    assert len(world.smtp.messages) == 2


def test_a_sender_without_oauth_keeps_its_transports_mailer(world: World) -> None:
    plain = replace(world.sender, id="s000000000001", email="plain@example.com", oauth=None)
    default = world.mailers.for_sender(replace(plain, transport=None))

    assert isinstance(default, RecordingMailer)
    assert world.mailers.for_sender(plain) is world.mailers.for_sender(plain)


def test_the_probe_signs_in_with_xoauth2_and_sends_nothing(world: World) -> None:
    mailer = world.mailer()
    assert isinstance(mailer, Probe)

    assert mailer.probe(5).endswith(", AUTH XOAUTH2 as news@example.com")
    assert world.smtp.attempts == ["ok"] and world.smtp.messages == []


def test_a_server_without_xoauth2_fails_the_send_for_good(
    world: World, make_smtp_sink: Callable[..., SmtpSink]
) -> None:
    sink = make_smtp_sink(auth=("news@example.com", "secret"))  # PLAIN and LOGIN only
    world.store.update_sender(replace(world.sender, transport=sink.url()))

    with pytest.raises(PermanentMailError, match="does not offer AUTH XOAUTH2"):
        world.send()

    assert world.endpoint.calls == 0
