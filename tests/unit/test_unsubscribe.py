"""One-click unsubscribe (issue 14): the links and headers, {{ unsubscribe_url }} and the
footer, the settings that turn them on, and the service behind the routes."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from sendqueue.bootstrap import Container
from sendqueue.domain.errors import NotFound
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import Campaign, Recipient, Task, new_campaign_id
from sendqueue.domain.suppression import SuppressionReason
from sendqueue.domain.tokens import TokenPurpose, sign_task
from sendqueue.domain.unsubscribe import (
    UNSUBSCRIBE_URL_PLACEHOLDER,
    UnsubscribeLinks,
    personalize,
)
from sendqueue.runtime import announce_unsubscribe_links
from sendqueue.services.templates.render import Templates
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from tests.support.app import T0, csv_bytes, fake_app, open_policy

SECRET = "unsubscribe-test-key-0123456789abcdef"
PUBLIC = "https://mail.example.com"
LINKS: dict[str, Any] = {"public_url": PUBLIC, "secret_key": SECRET}


def _sent_campaign(app: Container, count: int = 2, **campaign: Any) -> tuple[str, list[Task]]:
    """A campaign of ``count`` recipients, provisioned and sent (all Finished)."""
    rows = "".join(f"user{i}@example.com,User {i},Hello\n" for i in range(count))
    created = app.campaign_import.create(
        name="t",
        recipients=f"email,name,subject\n{rows}".encode(),
        policy=open_policy(),
        from_addr="News <n@example.com>",
        templates=Templates(body="Hi {{ name }}, leave here: {{ unsubscribe_url }}"),
        **campaign,
    )
    cid = created.campaign.id
    assert app.provisioner.provision(cid).status == "done"
    _send_due(app)
    return cid, app.store.list_tasks(cid, limit=100)


def _send_due(app: Container) -> None:
    """An hour on, everything due is sent."""
    clock, scheduler = app.clock, app.scheduler
    assert isinstance(clock, FakeClock)
    assert isinstance(scheduler, FakeScheduler)
    clock.advance(hours=1)
    scheduler.fire_due(app.invoke)


# --- links and headers --------------------------------------------------------------------------


def test_the_headers_name_the_signed_link_and_ask_for_one_click() -> None:
    links = UnsubscribeLinks(PUBLIC, SECRET)
    token = sign_task("c0123456789ab-7", SECRET, TokenPurpose.UNSUBSCRIBE)
    assert links.headers("c0123456789ab-7") == {
        "List-Unsubscribe": f"<{PUBLIC}/u/{token}>",
        "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
    }
    assert links.task_of(token) == "c0123456789ab-7"


def test_the_mailbox_adds_a_mailto_alternative_whose_subject_names_the_token() -> None:
    links = UnsubscribeLinks("https://example.com/mail", SECRET, "leave+list@example.com")
    token = links.token("c0123456789ab-0")
    assert links.headers("c0123456789ab-0")["List-Unsubscribe"] == (
        f"<https://example.com/mail/u/{token}>, "
        f"<mailto:leave%2Blist@example.com?subject=unsubscribe%20{token}>"
    )


def test_the_secret_never_shows_in_a_repr() -> None:
    assert SECRET not in repr(UnsubscribeLinks(PUBLIC, SECRET))
    assert SECRET not in repr(fake_app(**LINKS).config)


@given(st.integers(0, 39), st.sampled_from("0123456789abcdef"))
def test_a_token_altered_anywhere_is_refused(index: int, char: str) -> None:
    links = UnsubscribeLinks(PUBLIC, SECRET)
    token = links.token("c0123456789ab-12")
    altered = token[:index] + char + token[index + 1 :]
    assert links.task_of(altered) == (None if altered != token else "c0123456789ab-12")
    # the same token signed for bounces, or with another key, is not an unsubscribe token
    assert links.task_of(sign_task("c0123456789ab-12", SECRET, TokenPurpose.BOUNCE)) is None
    assert UnsubscribeLinks(PUBLIC, SECRET[::-1]).task_of(token) is None


# --- the footer and {{ unsubscribe_url }} ---------------------------------------------------------


def test_personalize_puts_the_link_in_place_and_adds_the_footer() -> None:
    url = f"{PUBLIC}/u/c0123456789ab-1.{'a' * 32}"
    html = f'<html><body><a href="{UNSUBSCRIBE_URL_PLACEHOLDER}">x</a></BODY></html>'
    parts = personalize("Hi", f"Leave: {UNSUBSCRIBE_URL_PLACEHOLDER}", html, url, footer=True)
    assert parts.text == f"Leave: {url}\n\nUnsubscribe: {url}\n"
    assert parts.html is not None
    assert parts.html.startswith(f'<html><body><a href="{url}">x</a><p ')
    assert parts.html.endswith(
        f'<a href="{url}">Unsubscribe</a> from these emails.</p>\n</BODY></html>'
    )


def test_the_html_footer_escapes_the_url_and_goes_last_without_a_body_tag() -> None:
    url = 'https://ex.com/u/a"b<c>&d'
    parts = personalize("s", "text\n", "<p>hi</p>", url, footer=True)
    assert parts.text == f"text\n\nUnsubscribe: {url}\n"
    assert parts.html is not None
    assert "https://ex.com/u/a&quot;b&lt;c&gt;&amp;d" in parts.html
    assert url not in parts.html


def test_without_links_nothing_changes_and_no_footer() -> None:
    parts = personalize("s", UNSUBSCRIBE_URL_PLACEHOLDER, None, None, footer=True)
    assert (parts.subject, parts.text, parts.html) == ("s", UNSUBSCRIBE_URL_PLACEHOLDER, None)


def test_every_email_carries_its_own_link_in_headers_and_body() -> None:
    mailer = RecordingMailer()
    app = fake_app(mailer=mailer, unsubscribe_mailbox="leave@example.com", **LINKS)
    _, tasks = _sent_campaign(app)
    assert len(mailer.sent) == 2
    links = app.config.unsubscribe
    assert links is not None
    for task in tasks:
        [message] = mailer.sent_to(task.email)
        url = links.url(task.id)
        assert message.headers["List-Unsubscribe"] == (
            f"<{url}>, <mailto:leave@example.com?subject=unsubscribe%20{links.token(task.id)}>"
        )
        assert message.headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
        assert message.text.endswith(f"leave here: {url}")  # no footer unless asked
        # the task keeps the rendered template; the link is made at send time
        assert UNSUBSCRIBE_URL_PLACEHOLDER in task.text


def test_without_public_url_and_secret_no_header_is_sent() -> None:
    mailer = RecordingMailer()
    app = fake_app(mailer=mailer)
    assert app.config.unsubscribe is None
    _sent_campaign(app, count=1)
    [message] = mailer.sent
    assert "List-Unsubscribe" not in message.headers
    assert "List-Unsubscribe-Post" not in message.headers
    assert message.headers["X-Sendqueue-Task"]


def test_the_campaign_footer_ends_text_and_html_at_send_time() -> None:
    mailer = RecordingMailer()
    app = fake_app(mailer=mailer, **LINKS)
    cid = new_campaign_id()
    app.store.create_campaign(
        Campaign(
            id=cid,
            name="footer",
            policy=open_policy(),
            from_addr="n@example.com",
            unsubscribe_footer=True,
            created_at=T0,
            updated_at=T0,
        ),
        [Recipient(0, "a@example.com", "A", "Hello", "Body", "<body><p>Hi</p></body>", {})],
    )
    assert app.provisioner.provision(cid).status == "done"
    _send_due(app)
    [message] = mailer.sent
    [task] = app.store.list_tasks(cid, limit=10)
    url = app.config.unsubscribe.url(task.id)  # type: ignore[union-attr]
    assert message.text == f"Body\n\nUnsubscribe: {url}\n"
    assert message.html is not None
    assert message.html.endswith(f'<a href="{url}">Unsubscribe</a> from these emails.</p>\n</body>')


def test_the_worker_says_at_start_whether_emails_carry_the_link(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="sendqueue.runtime"):
        announce_unsubscribe_links(fake_app())
        announce_unsubscribe_links(fake_app(**LINKS))
    off, on = (r.getMessage() for r in caplog.records)
    assert off.startswith("unsubscribe links off: emails carry no List-Unsubscribe header")
    assert "SENDQUEUE_PUBLIC_URL and SENDQUEUE_SECRET_KEY" in off
    assert on == f"unsubscribe links: {PUBLIC}/u/<token>"
    assert SECRET not in caplog.text


def test_a_task_id_sendqueue_did_not_make_is_sent_without_a_link(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Never made by sendqueue itself (campaign ids are "c" + 12 hex digits); a store filled by
    # hand must still not leave the task Running forever.
    mailer = RecordingMailer()
    app = fake_app(mailer=mailer, **LINKS)
    app.store.create_campaign(
        Campaign(id="hand-made", name="x", policy=open_policy(), from_addr="n@example.com"),
        [Recipient(0, "a@example.com", "A", "Hello", "Body", None, {})],
    )
    assert app.provisioner.provision("hand-made").status == "done"
    with caplog.at_level(logging.ERROR, logger="sendqueue.services.sending.worker"):
        _send_due(app)
    [message] = mailer.sent
    assert "List-Unsubscribe" not in message.headers
    assert app.store.get_task("hand-made-0").state is TaskState.FINISHED  # type: ignore[union-attr]
    assert "task hand-made-0: sent without an unsubscribe link" in caplog.text


# --- settings ----------------------------------------------------------------------------------


def _settings(**values: Any) -> Settings:
    return Settings(_env_file=None, **values)


PROD = {
    "environment": "production",
    "mailer": "smtp://127.0.0.1:25",
    "api_token": "x" * 4 + "a-token-of-twenty-chars0",
}


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({}, "SENDQUEUE_PUBLIC_URL and SENDQUEUE_SECRET_KEY required"),
        ({"public_url": PUBLIC}, "SENDQUEUE_SECRET_KEY required"),
        ({"secret_key": SECRET}, "SENDQUEUE_PUBLIC_URL required"),
        ({"public_url": "http://mail.example.com", "secret_key": SECRET}, "must be an https://"),
    ],
)
def test_production_requires_the_links_over_https(values: dict[str, str], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        _settings(**PROD, **values)
    assert _settings(**PROD, **LINKS).unsubscribe_links == UnsubscribeLinks(PUBLIC, SECRET)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("secret_key", "too-short-0123456789", "SENDQUEUE_SECRET_KEY: must be at least 32"),
        ("secret_key", "ab" * 20, "SENDQUEUE_SECRET_KEY: too easy to guess"),
        ("public_url", "ftp://mail.example.com", "SENDQUEUE_PUBLIC_URL: expected the https://"),
        ("public_url", "https://mail.example.com/?a=1", "SENDQUEUE_PUBLIC_URL: no user, query"),
        ("public_url", "https://u:p@mail.example.com", "SENDQUEUE_PUBLIC_URL: no user, query"),
        ("public_url", "https://mail.example.com:99999", "SENDQUEUE_PUBLIC_URL: not a URL"),
        ("public_url", "https://mail.example.com/a>b", "SENDQUEUE_PUBLIC_URL: no spaces"),
        ("public_url", "https://mail.example.com/<a", "SENDQUEUE_PUBLIC_URL: no spaces"),
        ("public_url", 'https://mail.example.com/a"b', "SENDQUEUE_PUBLIC_URL: no spaces"),
        ("unsubscribe_mailbox", "not an address", "SENDQUEUE_UNSUBSCRIBE_MAILBOX"),
        ("unsubscribe_mailbox", "Leave <l@example.com>", "SENDQUEUE_UNSUBSCRIBE_MAILBOX: a bare"),
    ],
)
def test_bad_values_are_refused_naming_the_variable(field: str, value: str, named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        _settings(**{field: value})


def test_development_without_the_settings_has_no_links_and_a_trailing_slash_is_dropped() -> None:
    assert _settings().unsubscribe_links is None
    assert _settings(public_url=PUBLIC).unsubscribe_links is None  # the key is missing
    links = _settings(public_url="http://127.0.0.1:8000/", secret_key=SECRET).unsubscribe_links
    assert links is not None
    assert links.url("c0123456789ab-0").startswith("http://127.0.0.1:8000/u/c0123456789ab-0.")


# --- the service -------------------------------------------------------------------------------


def test_unsubscribe_suppresses_and_cancels_the_other_pending_emails() -> None:
    app = fake_app(**LINKS)
    _, sent = _sent_campaign(app)
    later = app.campaign_import.create(
        name="later",
        recipients=csv_bytes(2),
        policy=open_policy(start=T0 + timedelta(days=10)),
    ).campaign.id
    assert app.provisioner.provision(later).status == "done"
    links = app.config.unsubscribe
    assert links is not None
    target = sent[1]

    seen = app.unsubscribe.look_up(links.token(target.id))
    assert (seen.address, seen.unsubscribed) == ("u***@example.com", False)
    assert app.suppressions.suppressed([target.email]) == {}  # a look-up changes nothing

    done = app.unsubscribe.unsubscribe(links.token(target.id))
    assert (done.unsubscribed, done.cancelled, done.sender) == (True, 1, "News <n@example.com>")
    assert app.store.get_task(target.id).outcome is TaskOutcome.UNSUBSCRIBED  # type: ignore[union-attr]
    entry = app.suppressions.suppressed([target.email])[target.email]
    assert (entry.reason, entry.task_id) == (SuppressionReason.UNSUBSCRIBED, target.id)
    pending = {t.email: t for t in app.store.list_tasks(later, limit=10)}
    assert pending[target.email].state is TaskState.CANCELLED
    assert pending[target.email].reason == "suppressed: unsubscribed"
    assert pending[sent[0].email].state is TaskState.PENDING
    # twice is harmless, and the page then says so
    again = app.unsubscribe.unsubscribe(links.token(target.id))
    assert (again.unsubscribed, again.cancelled) == (True, 0)
    assert app.unsubscribe.look_up(links.token(target.id)).unsubscribed


@pytest.mark.parametrize(
    "token",
    [
        "",
        "nonsense",
        "c0123456789ab-0." + "0" * 32,  # well-formed, wrong mac
        "c0123456789ab-0",
    ],
)
def test_a_forged_token_is_not_found_and_changes_nothing(token: str) -> None:
    app = fake_app(**LINKS)
    _, sent = _sent_campaign(app, count=1)
    before = app.store.last_change_id()
    with pytest.raises(NotFound):
        app.unsubscribe.unsubscribe(token)
    with pytest.raises(NotFound):
        app.unsubscribe.look_up(token)
    assert app.store.last_change_id() == before
    assert app.suppressions.count_suppressions() == 0
    assert app.store.get_task(sent[0].id).outcome is not TaskOutcome.UNSUBSCRIBED  # type: ignore[union-attr]


def test_a_genuine_token_of_an_unknown_task_or_without_links_is_not_found() -> None:
    app = fake_app(**LINKS)
    with pytest.raises(NotFound):
        app.unsubscribe.unsubscribe(UnsubscribeLinks(PUBLIC, SECRET).token("c0123456789ab-0"))
    unconfigured = fake_app()
    _, sent = _sent_campaign(unconfigured, count=1)
    with pytest.raises(NotFound):
        unconfigured.unsubscribe.unsubscribe(UnsubscribeLinks(PUBLIC, SECRET).token(sent[0].id))


# --- red team (issue 14 review) -----------------------------------------------------------------


def test_a_task_id_sendqueue_did_not_make_is_sent_without_verp_when_a_bounce_address_is_set(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The same hand-made id as above, now with SENDQUEUE_BOUNCE_ADDRESS: the VERP address is
    # signed with the same token scheme, so it must not leave the task Running either.
    mailer = RecordingMailer()
    app = fake_app(mailer=mailer, bounce_address="bounces@example.com", **LINKS)
    app.store.create_campaign(
        Campaign(id="hand-made", name="x", policy=open_policy(), from_addr="n@example.com"),
        [Recipient(0, "a@example.com", "A", "Hello", "Body", None, {})],
    )
    assert app.provisioner.provision("hand-made").status == "done"
    with caplog.at_level(logging.ERROR, logger="sendqueue.services.sending.worker"):
        _send_due(app)
    [message] = mailer.sent
    assert message.envelope_from is None  # the From is the envelope sender
    assert app.store.get_task("hand-made-0").state is TaskState.FINISHED  # type: ignore[union-attr]


def test_an_urlencoded_unsubscribe_url_is_replaced_too() -> None:
    # A template passing the link on to a redirect (?next={{ unsubscribe_url|urlencode }}):
    # Jinja's urlencode quotes the ":" of the placeholder, which must still become the link.
    mailer = RecordingMailer()
    app = fake_app(mailer=mailer, **LINKS)
    created = app.campaign_import.create(
        name="t",
        recipients=b"email,name,subject\nuser0@example.com,User 0,Hello\n",
        policy=open_policy(),
        from_addr="News <n@example.com>",
        templates=Templates(body="Leave: https://r.example/?next={{ unsubscribe_url|urlencode }}"),
    )
    assert app.provisioner.provision(created.campaign.id).status == "done"
    _send_due(app)
    [message] = mailer.sent
    assert "sendqueue.invalid" not in message.text
    token = sign_task(f"{created.campaign.id}-0", SECRET, TokenPurpose.UNSUBSCRIBE)
    assert f"next=https%3A//mail.example.com/u/{token}" in message.text
