"""SenderMailers under the transport rules when a sender with an OAuth grant has no transport
of its own: its access token goes to the configured mailer (SENDQUEUE_MAILER), which must then
not be plain text to another machine, however that mailer is allowed without a password."""

from __future__ import annotations

import pytest

from sendqueue.adapters.mail.factory import RefusedTransport, SenderMailers
from sendqueue.adapters.oauth import OAuthTokens
from sendqueue.bootstrap import bootstrap
from sendqueue.domain.errors import InvalidField, PermanentMailError
from sendqueue.domain.senders import OAuthGrant, Sender
from sendqueue.domain.transports import TransportRules
from sendqueue.settings import Settings
from sendqueue.testing import InMemoryTaskStore
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import T0

GRANT = OAuthGrant("https://login.example.com/token", "app", "rt-1", "cs")
SENDER = Sender(id="s0123456789ab", email="news@example.com", name="News", oauth=GRANT)


def _mailers(default_url: str, rules: TransportRules | None = None) -> SenderMailers:
    store = InMemoryTaskStore()
    store.add_sender(SENDER)
    tokens = OAuthTokens(store, FakeClock())
    return SenderMailers(RecordingMailer, default_url, tokens, rules or TransportRules())


def test_no_token_in_plain_text_to_another_host_through_the_configured_mailer() -> None:
    mailers = _mailers("smtp://relay.example.net:25?security=none")  # fine without a token

    mailer = mailers.for_sender(SENDER)

    assert isinstance(mailer, RefusedTransport)
    assert "unencrypted to relay.example.net:25" in mailer.reason
    with pytest.raises(PermanentMailError, match="unencrypted"):
        mailer.probe(1.0)


@pytest.mark.parametrize(
    "url", ["smtp://127.0.0.1:2525?security=none", "smtp://smtp.example.net:587"]
)
def test_the_configured_mailer_signs_in_with_the_token_when_the_rules_allow(url: str) -> None:
    # the allow-list is not SENDQUEUE_MAILER's: only the plain-text rule applies to it
    mailers = _mailers(url, TransportRules(hosts=("*.example.org",)))

    assert not isinstance(mailers.for_sender(SENDER), RefusedTransport)


def test_an_oauth_sender_without_a_transport_is_refused_when_written_naming_oauth() -> None:
    clock = FakeClock(T0)
    app = bootstrap(
        Settings(_env_file=None, mailer="smtp://relay.example.net:25?security=none"),
        clock=clock,
        store=InMemoryTaskStore(),
        scheduler=FakeScheduler(clock, seed=1),
        mailer=RecordingMailer(),
    )
    grant = {"token_url": GRANT.token_url, "client_id": "app", "refresh_token": "rt-Zq8"}

    with pytest.raises(InvalidField) as refused:
        app.senders.add(email="news@example.com", oauth=grant)
    assert refused.value.field == "oauth" and "relay.example.net:25" in str(refused.value)
    assert "rt-Zq8" not in str(refused.value) and app.senders.all() == []
    plain = app.senders.add(email="plain@example.com")  # no token: the relay is fine
    with pytest.raises(InvalidField, match="oauth"):
        app.senders.update(plain.id, {"oauth": grant})
    assert app.senders.get(plain.id).oauth is None
    # with a transport of its own over TLS, the configured mailer is not its
    app.senders.add(email="tls@example.com", transport="smtp://smtp.example.net:587", oauth=grant)
