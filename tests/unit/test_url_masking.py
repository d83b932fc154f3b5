"""No password shows, whatever it holds: for any password text (raw ``/ ? # @ : % [ ]``,
spaces, non-ASCII, characters that NFKC turns into ``/``), no masked URL, parse error, repr,
settings error or sender view quotes it. Each password carries a marker letter found nowhere
else, so a piece of it showing is caught, not only the whole."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import suppress

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sendqueue.adapters.imap.source import ImapFeedbackSource
from sendqueue.adapters.imap.url import parse_imap_url
from sendqueue.adapters.mail.smtp import SmtpMailer
from sendqueue.adapters.mail.url import parse_mailer_url
from sendqueue.domain.errors import InvalidField, InvalidSettings
from sendqueue.domain.transports import TransportRules, mask_url
from sendqueue.services.senders.service import SenderService, SenderView
from sendqueue.settings import Settings, load_settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.app import T0

MARK = "ж"
#: Characters a URL parser treats specially, and some that NFKC maps onto them.
_SPECIAL = "/?#@:%[]= \t&;\\\uff0f\uff1f\uff03\uff20\u2100"
_TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from(_SPECIAL),
        st.characters(exclude_categories=["Cs"], exclude_characters="\r\n\x00" + MARK),
    ),
    max_size=24,
)
PASSWORDS = st.builds(lambda a, b: f"{a}{MARK}{b}", _TEXT, _TEXT)

#: URLs with a password, as users write them (unencoded), over each parser.
FORMS = (
    "smtp://anna:{}@smtp.example.com:587?security=starttls",
    "smtp://anna:{}@127.0.0.1:25?security=none",
    "imaps://anna:{}@imap.example.com/INBOX",
    "imap://anna:{}@imap.example.com:143/INBOX?security=none",
    "smtp://anna%40example.com:{}@smtp.example.com",
)


def _shown(url: str) -> Iterator[str]:
    """Everything sendqueue may show of ``url``: masked, parsed (reprs) or refused (errors)."""
    yield mask_url(url)
    for parse in (parse_mailer_url, parse_imap_url):
        try:
            yield repr(parse(url))
        except InvalidField as exc:
            yield str(exc)
            yield repr(exc)
    for build in (SmtpMailer.from_url, ImapFeedbackSource.from_url):
        with suppress(InvalidField):
            yield repr(build(url))
    service = SenderService(
        InMemoryTaskStore(),
        FakeClock(T0),
        default_timezone="UTC",
        check_transport=lambda u, **_: parse_mailer_url(u),
        check_imap=lambda u, **_: parse_imap_url(u, field="imap"),
    )
    for name in ("transport", "imap"):
        try:
            if name == "imap":
                sender = service.add(email="anna@example.com", imap=url)
            else:
                sender = service.add(email="anna@example.com", transport=url)
            yield repr(sender)
            yield str(SenderView.of(sender).as_dict())
        except InvalidField as exc:
            yield str(exc)
            yield str(exc.as_dict())


def _settings_errors(url: str, password: str) -> Iterator[str]:
    database = f"postgresql+psycopg://anna:{password}@db.example.com:5432/sq"
    for name, value in (("mailer", url), ("feedback_imap", url), ("database_url", database)):
        values = {"_env_file": None, name: value, "secret_key": "masking-test-secret-0123456789ab"}
        try:
            yield repr(load_settings(Settings, **values))
        except InvalidSettings as exc:
            yield str(exc)
            yield from exc.problems


@settings(max_examples=300, deadline=None)
@given(PASSWORDS, st.sampled_from(FORMS))
def test_no_view_error_or_repr_shows_any_piece_of_the_password(password: str, form: str) -> None:
    url = form.format(password)
    for text in _shown(url):
        assert MARK not in text, (url, text)


@settings(max_examples=100, deadline=None)
@given(PASSWORDS, st.sampled_from(FORMS[:4]))
@example("@/ж", FORMS[0])  # an "@" then a "/" in the password: the netloc ends at the "/"
def test_no_settings_error_shows_any_piece_of_the_password(password: str, form: str) -> None:
    url = form.format(password)
    for text in _settings_errors(url, password):
        assert MARK not in text, (url, text)


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("smtp://anna:se/cr?et#@smtp.example.com:587?k=v", "smtp://***@smtp.example.com:587"),
        ("smtp://anna:p@ss:w%rd@smtp.example.com:587", "smtp://anna:***@smtp.example.com:587"),
        (
            "smtp://anna:pw@smtp.example.com:587?security=tls",
            "smtp://anna:***@smtp.example.com:587",
        ),
        ("smtp://relay.example.com:25", "smtp://relay.example.com:25"),
        ("smtp://anna:secret/relay.example.com", "smtp://***/relay.example.com"),
        ("imaps://anna@imap.example.com/INBOX", "imaps://anna@imap.example.com/INBOX"),
        ("ses:eu-west-1?configuration_set=x", "ses:eu-west-1"),
        ("maildir:./outbox", "maildir:./outbox"),
        ("smtp:anna:secret@relay", "smtp:***@relay"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_a_password_with_a_slash_is_refused_with_a_fixed_reason() -> None:
    with pytest.raises(InvalidField) as raised:
        parse_mailer_url("smtp://anna:123/456@smtp.example.com:587")
    assert raised.value.field == "mailer" and "percent-encoded" in raised.value.reason
    assert not re.search(r"123|456", str(raised.value))


def test_the_rules_name_the_field_and_the_host() -> None:
    rules = TransportRules(production=True, hosts=("*.example.com",))
    with pytest.raises(InvalidField) as raised:
        rules.check_host(
            "imap", "imaps://a:***@x.org", "x.org", port=993, password=True, encrypted=True
        )
    assert raised.value.field == "imap" and "x.org" in raised.value.reason
    rules.check_host("transport", "-", "smtp.example.com", port=587, password=True, encrypted=True)
    with pytest.raises(InvalidField, match=re.escape("unencrypted to smtp.example.com:25")):
        rules.check_host(
            "transport", "-", "smtp.example.com", port=25, password=True, encrypted=False
        )
    TransportRules().check_host(
        "transport", "-", "127.0.0.2", port=25, password=True, encrypted=False
    )
    with pytest.raises(InvalidField, match="delivers nothing"):
        rules.check_maildir("transport", "maildir:./out")


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"transport_hosts": "smtp.example.com, *.example.org"}, None),
        ({"transport_hosts": "smtp.example.com, https://x"}, "SENDQUEUE_TRANSPORT_HOSTS"),
        ({"transport_hosts": "*.*.example.org"}, "SENDQUEUE_TRANSPORT_HOSTS"),
        (
            {"mailer": "smtp://anna:pw@smtp.example.com:25?security=none"},
            "SENDQUEUE_MAILER: refusing to send a password unencrypted to smtp.example.com:25",
        ),
        ({"mailer": "smtp://anna:pw@127.0.0.5:25?security=none"}, None),
        (
            {"feedback_imap": "imap://anna:pw@imap.example.com/INBOX?security=none"},
            "SENDQUEUE_FEEDBACK_IMAP: refusing to send a password unencrypted",
        ),
    ],
)
def test_the_settings_apply_the_transport_rules(env: dict[str, str], words: str | None) -> None:
    values = {"_env_file": None, "secret_key": "masking-test-secret-0123456789ab", **env}
    if words is None:
        loaded = load_settings(Settings, **values)
        assert loaded.transport_rules.hosts == tuple(
            h.strip() for h in env.get("transport_hosts", "").split(",") if h.strip()
        )
        return
    with pytest.raises(InvalidSettings) as raised:
        load_settings(Settings, **values)
    assert any(problem.startswith(words) for problem in raised.value.problems), raised.value
