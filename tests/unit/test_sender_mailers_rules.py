"""SenderMailers under the transport rules when a sender with an OAuth grant has no transport
of its own: its access token goes to the configured mailer (SENDQUEUE_MAILER), which must then
not be plain text to another machine, however that mailer is allowed without a password."""

from __future__ import annotations

import pytest

from sendqueue.adapters.mail.factory import RefusedTransport, SenderMailers
from sendqueue.adapters.oauth import OAuthTokens
from sendqueue.domain.errors import PermanentMailError
from sendqueue.domain.senders import OAuthGrant, Sender
from sendqueue.domain.transports import TransportRules
from sendqueue.testing import InMemoryTaskStore
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer

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
