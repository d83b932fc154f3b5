"""The SENDQUEUE_FEEDBACK_IMAP URL: the mailer URL's rules (percent-decoded credentials, a port
by security, errors naming the setting without the password), and the settings built on it."""

from __future__ import annotations

import secrets
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from sendqueue.adapters.imap import ImapFeedbackSource, parse_imap_url
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.transports import TransportRules
from sendqueue.settings import Settings


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("imap://u:p@mail.example.com/INBOX", ("mail.example.com", 143, "starttls", "INBOX")),
        ("imap://u:p@mail.example.com", ("mail.example.com", 143, "starttls", "INBOX")),
        ("imap://u:p@h:1143/INBOX?security=none", ("h", 1143, "none", "INBOX")),
        ("imap://u:p@h/INBOX?security=tls", ("h", 993, "tls", "INBOX")),
        ("imaps://u:p@h/Bounces%20Box", ("h", 993, "tls", "Bounces Box")),
        ("imaps://u:p@[::1]:9993/INBOX/Sub", ("::1", 9993, "tls", "INBOX/Sub")),
    ],
)
def test_urls_taken_apart(url: str, expected: tuple[str, int, str, str]) -> None:
    parsed = parse_imap_url(url)
    assert (parsed.host, parsed.port, parsed.security, parsed.folder) == expected
    assert (parsed.username, parsed.password, parsed.timeout) == ("u", "p", 30.0)


_SECRET = "s3cr%3At"
KEY = secrets.token_hex(16)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        (f"pop3://u:{_SECRET}@h/INBOX", "expected imap://user:pass@host:143/INBOX"),
        (f"imap://u:{_SECRET}@/INBOX", "expected imap://"),
        (f"imap://u:{_SECRET}@h:0/INBOX", "the port must be 1..65535"),
        (f"imap://u:{_SECRET}@h:99999/INBOX", "malformed URL"),
        (f"imap://u:{_SECRET}@h/INBOX?security=ssl", "security must be starttls, tls or none"),
        (f"imaps://u:{_SECRET}@h/INBOX?security=none", "imaps:// is implicit TLS"),
        (f"imap://u:{_SECRET}@h/INBOX?folder=x", "unknown imap:// parameter 'folder'"),
        (f"imap://u:{_SECRET}@h/INBOX?timeout=0", "timeout must be greater than 0"),
        (f"imap://u:{_SECRET}@h/INBOX?timeout=soon", "timeout must be a number"),
        (f"imap://u:{_SECRET}@h/INBOX?timeout=1&timeout=2", "given twice"),
        (f"imap://u:{_SECRET}@h/INBOX#frag", "no fragment"),
        ("imap://u@h/INBOX", "user and password are required"),
        (f"imap://u:{_SECRET}@h/IN%0ABOX", "control characters"),
    ],
)
def test_bad_urls_name_the_setting_and_never_show_the_password(url: str, reason: str) -> None:
    with pytest.raises(InvalidField) as info:
        parse_imap_url(url)
    assert info.value.field == "feedback_imap"
    assert reason in info.value.reason
    assert "s3cr" not in str(info.value)
    with pytest.raises(ValidationError) as settings_info:
        Settings(_env_file=None, feedback_imap=url)
    assert "SENDQUEUE_FEEDBACK_IMAP" in str(settings_info.value)
    assert "s3cr" not in str(settings_info.value)


_TEXT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)


@given(
    user=_TEXT,
    password=_TEXT,
    folder=_TEXT.filter(lambda f: not any(c in f for c in "\r\n\0")),
    port=st.integers(1, 65535),
    security=st.sampled_from(["starttls", "tls", "none"]),
)
def test_any_credentials_and_folder_survive_percent_encoding(
    user: str, password: str, folder: str, port: int, security: str
) -> None:
    url = (
        f"imap://{quote(user, safe='')}:{quote(password, safe='')}@mail.example.com:{port}/"
        f"{quote(folder, safe='/')}?security={security}"
    )
    parsed = parse_imap_url(url)
    assert (parsed.username, parsed.password, parsed.folder) == (user, password, folder)
    assert (parsed.port, parsed.security) == (port, security)
    assert "password=" not in repr(parsed)  # the field is left out of the repr
    source = ImapFeedbackSource(parsed)
    assert source.name == f"imap://{user}@mail.example.com:{port}/{folder}"


def test_the_name_and_repr_never_hold_the_password() -> None:
    parsed = parse_imap_url("imaps://bounces:Hunter2-secret@mail.example.com/INBOX")
    source = ImapFeedbackSource(parsed)
    for shown in (repr(parsed), parsed.name, repr(source), source.name):
        assert "Hunter2-secret" not in shown


def test_settings_refuse_a_password_in_clear_to_another_host_and_need_the_key() -> None:
    with pytest.raises(ValidationError, match="refusing to send a password unencrypted"):
        Settings(_env_file=None, feedback_imap="imap://u:p@mail.example.com/INBOX?security=none")
    local = Settings(
        _env_file=None, feedback_imap="imap://u:p@127.0.0.1/INBOX?security=none", secret_key=KEY
    )
    assert local.feedback_imap is not None
    # without the key no feedback could prove the email it is about
    with pytest.raises(ValidationError, match="SENDQUEUE_FEEDBACK_IMAP needs SENDQUEUE_SECRET"):
        Settings(_env_file=None, feedback_imap="imap://u:p@127.0.0.1/INBOX?security=none")
    assert "u:p@" not in repr(local)
    with pytest.raises(ValidationError, match="SENDQUEUE_BOUNCE_ADDRESS needs SENDQUEUE_SECRET"):
        Settings(_env_file=None, bounce_address="bounces@example.com")
    with pytest.raises(ValidationError, match="SENDQUEUE_BOUNCE_ADDRESS"):
        Settings(_env_file=None, bounce_address="not an address", secret_key=KEY)
    with pytest.raises(ValidationError, match="a bare address"):
        Settings(_env_file=None, bounce_address="B <b@example.com>", secret_key=KEY)
    with pytest.raises(ValidationError, match="feedback_interval"):
        Settings(_env_file=None, feedback_interval=0)
    ok = Settings(_env_file=None, bounce_address=" Bounces@Example.com ", secret_key=KEY)
    assert ok.bounce_address == "Bounces@example.com"
    assert ok.feedback_interval == 60.0


@pytest.mark.parametrize("value", ["0.09", "60.5", "0", "-1", "nan", "inf"])
def test_the_parse_budget_is_refused_outside_0_1_to_60_seconds(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SENDQUEUE_FEEDBACK_PARSE_SECONDS", value)
    with pytest.raises(ValidationError, match=r"SENDQUEUE_FEEDBACK_PARSE_SECONDS: 0\.1 to 60"):
        Settings(_env_file=None)


def test_the_parse_budget_is_2_seconds_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings(_env_file=None).feedback_parse_seconds == 2.0
    for value, seconds in (("0.1", 0.1), ("60", 60.0), ("7.5", 7.5)):
        monkeypatch.setenv("SENDQUEUE_FEEDBACK_PARSE_SECONDS", value)
        assert Settings(_env_file=None).feedback_parse_seconds == seconds


def test_a_senders_mailbox_opens_only_under_the_transport_rules() -> None:
    """The poll of a sender's own mailbox (``from_url(..., rules=...)``): a host outside the
    allow-list or a plain-text password to another machine is refused naming ``imap``."""
    rules = TransportRules(hosts=("*.example.com",))
    opened = ImapFeedbackSource.from_url(
        "imaps://anna:pw@imap.example.com/INBOX", field="imap", rules=rules
    )
    assert opened.name == "imap://anna@imap.example.com:993/INBOX"
    for url, words in [
        ("imaps://anna:Zq-9x@imap.other.org/INBOX", "imap.other.org is not in"),
        ("imap://anna:Zq-9x@imap.example.com/INBOX?security=none", "unencrypted"),
    ]:
        with pytest.raises(InvalidField) as raised:
            ImapFeedbackSource.from_url(url, field="imap", rules=rules)
        assert raised.value.field == "imap" and words in raised.value.reason
        assert "Zq-9x" not in str(raised.value)


@pytest.mark.parametrize("timeout", ["121", "86400", "1e9"])
def test_a_senders_mailbox_may_not_stall_the_poll_longer_than_two_minutes(timeout: str) -> None:
    """The mailboxes are read one after another: a silent server holds the pass for up to its
    timeout, so a sender's own mailbox takes at most 120 s (the feedback mailbox is the
    operator's setting and may take more)."""
    url = f"imaps://anna:Zq-9x@imap.example.com/INBOX?timeout={timeout}"
    with pytest.raises(InvalidField) as raised:
        ImapFeedbackSource.from_url(url, field="imap", rules=TransportRules())
    assert raised.value.field == "imap" and "at most 120" in raised.value.reason
    assert "Zq-9x" not in str(raised.value)
    assert parse_imap_url(url).timeout == float(timeout)
    allowed = url.replace(f"timeout={timeout}", "timeout=120")
    assert ImapFeedbackSource.from_url(allowed, field="imap", rules=TransportRules())


def test_the_feedback_mailbox_may_take_longer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SENDQUEUE_FEEDBACK_IMAP", "imaps://fb:pw@imap.example.com/?timeout=600")
    monkeypatch.setenv("SENDQUEUE_SECRET_KEY", secrets.token_urlsafe(32))
    assert Settings(_env_file=None).feedback_imap is not None
