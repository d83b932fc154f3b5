"""``sendqueue feedback poll``: its counts, ``--json``, and the exit statuses when there is no
mailbox (2) or it cannot be reached (3, a clear message without the password). The counts of
a real mailbox are checked through Postfix and Dovecot in test_feedback_real.py."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.integration.test_cli import cli, run
from tests.support.mailservers import Dovecot, free_port

__all__ = ["cli"]

KEY = "cli-feedback-test-key-0123456789abcdef"


def test_without_a_mailbox_it_says_what_to_set(cli: CliRunner) -> None:
    code, _, err = run(cli, "feedback", "poll")
    assert code == 2
    assert "SENDQUEUE_FEEDBACK_IMAP is not set" in err


def test_an_unreachable_mailbox_exits_3_naming_it_without_the_password(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    url = f"imap://bounces:Very-Secret-1@127.0.0.1:{port}/INBOX?security=none&timeout=2"
    monkeypatch.setenv("SENDQUEUE_FEEDBACK_IMAP", url)
    monkeypatch.setenv("SENDQUEUE_SECRET_KEY", KEY)
    code, out, err = run(cli, "feedback", "poll", "--json")
    assert code == 3
    assert f"imap://bounces@127.0.0.1:{port}/INBOX: connecting failed" in err
    assert json.loads(out)["errors"]
    assert "Very-Secret-1" not in out + err


def test_an_empty_mailbox_prints_zero_counts(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, dovecot: Dovecot
) -> None:
    monkeypatch.setenv("SENDQUEUE_FEEDBACK_IMAP", dovecot.url)
    monkeypatch.setenv("SENDQUEUE_SECRET_KEY", KEY)
    code, out, _ = run(cli, "feedback", "poll")
    assert code == 0
    assert out.splitlines()[:3] == ["messages: 0", "bounces: 0", "soft bounces: 0"]
    assert "skipped: 0" in out.splitlines()  # messages whose parse failed or ran out of time
    # a message from someone with nothing Pending: a possible reply, about nothing sent
    dovecot.deliver(b"From: a@example.org\r\nSubject: hi\r\n\r\nhello\r\n")
    code, out, _ = run(cli, "feedback", "poll", "--json")
    assert code == 0
    data = json.loads(out)
    assert (data["messages"], data["ignored"], data["replies"], data["errors"]) == (1, 1, 0, [])
    assert data["unverified"] == 1  # a From header alone proves nothing: noted, not applied
    assert data["skipped"] == 0
    code, out, _ = run(cli, "feedback", "poll", "--json")
    assert json.loads(out)["messages"] == 0
