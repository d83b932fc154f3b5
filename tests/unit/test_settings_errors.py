"""Refused settings read as plain sentences naming the variables (settings_errors): no
pydantic type tag, no link to errors.pydantic.dev, never a secret; the same for every process
that loads them (load_settings, bootstrap, the Lambda functions' cold start)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sendqueue import lambda_handlers
from sendqueue.bootstrap import bootstrap
from sendqueue.domain.errors import InvalidSettings
from sendqueue.settings import LambdaControlSettings, LambdaSettings, Settings, load_settings

PASSWORD = "hunter2-Zq8vX"
KEY = "k3y-" + "x7Rw" * 10
#: What pydantic's own text has and ours must not.
PYDANTIC_WORDS = ("errors.pydantic.dev", "type=", "Value error", "Input should", "validation error")


@pytest.fixture(autouse=True)
def environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Only the variables a test sets; no .env file (the working directory is empty)."""
    for key in list(os.environ):
        if key.startswith("SENDQUEUE_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    lambda_handlers.use()
    yield
    lambda_handlers.use()


def problems(monkeypatch: pytest.MonkeyPatch, **env: str) -> list[str]:
    for name, value in env.items():
        monkeypatch.setenv(f"SENDQUEUE_{name.upper()}", value)
    with pytest.raises(InvalidSettings) as caught:
        load_settings(Settings)
    found = list(caught.value.problems)
    assert str(caught.value) == "\n".join(found)
    for line in found:
        assert not any(word in line for word in PYDANTIC_WORDS), line
        assert PASSWORD not in line and KEY not in line
    return found


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        # a range names the variable and every limit of it, not only the one crossed
        (
            {"feedback_interval": "0"},
            "SENDQUEUE_FEEDBACK_INTERVAL: must be at least 1 and at most 86400",
        ),
        ({"poll_interval": "0"}, "SENDQUEUE_POLL_INTERVAL: must be more than 0 and at most 60"),
        ({"max_recipients": "0"}, "SENDQUEUE_MAX_RECIPIENTS: must be at least 1"),
        ({"max_attempts": "three"}, "SENDQUEUE_MAX_ATTEMPTS: must be a whole number"),
        ({"retry_backoff": "soon"}, "SENDQUEUE_RETRY_BACKOFF: must be a number"),
        (
            {"suppress_replies": "maybe"},
            "SENDQUEUE_SUPPRESS_REPLIES: must be true or false (also 1/0, yes/no, on/off)",
        ),
        (
            {"execution": "cron"},
            "SENDQUEUE_EXECUTION: must be 'embedded', 'procrastinate' or 'eventbridge'",
        ),
        # a validator's message that does not name its variable gets it in front
        (
            {"schedule_group": "my group"},
            "SENDQUEUE_SCHEDULE_GROUP: a schedule group name is 1 to 64 characters of letters, "
            "digits, '-', '_' and '.'",
        ),
        # one that names it is kept as it is (no SENDQUEUE_MAILER: SENDQUEUE_MAILER:)
        (
            {"mailer": f"smtp://u:{PASSWORD}@smtp.example.com:99999"},
            "SENDQUEUE_MAILER: malformed URL: Port out of range 0-65535",
        ),
        # a rule across variables (a model validator) names them itself
        (
            {"feedback_imap": f"imaps://u:{PASSWORD}@imap.example.com/INBOX"},
            "SENDQUEUE_FEEDBACK_IMAP needs SENDQUEUE_SECRET_KEY, which signs the Message-ID of "
            "every email: a bounce or a reply counts only when it proves the email it is about",
        ),
    ],
)
def test_one_plain_sentence_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    assert problems(monkeypatch, **env) == [expected]


def test_every_problem_is_one_line_in_the_order_of_the_fields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found = problems(
        monkeypatch, feedback_interval="0", execution="cron", api_token="short", max_attempts="0"
    )
    assert found == [
        "SENDQUEUE_EXECUTION: must be 'embedded', 'procrastinate' or 'eventbridge'",
        "SENDQUEUE_MAX_ATTEMPTS: must be at least 1 and at most 20",
        "SENDQUEUE_FEEDBACK_INTERVAL: must be at least 1 and at most 86400",
    ]
    # The model's rules run once its fields are valid: the token's length comes next.
    assert problems(monkeypatch, feedback_interval="1", execution="embedded", max_attempts="1") == [
        "SENDQUEUE_API_TOKEN: must be at least 16 characters long"
    ]


@pytest.mark.parametrize(
    ("name", "secret", "says"),
    [
        ("secret_key", KEY[:20], "SENDQUEUE_SECRET_KEY: must be at least 32 characters long"),
        ("api_token", "ab" * 10, "SENDQUEUE_API_TOKEN: too easy to guess"),
        ("api_token", PASSWORD, "SENDQUEUE_API_TOKEN: must be at least 16 characters long"),
        ("mailer", f"smtp://u:{PASSWORD}@mail.example.com:25?security=none", "SENDQUEUE_MAILER"),
    ],
)
def test_a_refused_secret_is_never_quoted(
    monkeypatch: pytest.MonkeyPatch, name: str, secret: str, says: str
) -> None:
    (line,) = problems(monkeypatch, **{name: secret})
    assert line.startswith(says) and secret not in line


def test_values_given_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SENDQUEUE_FEEDBACK_INTERVAL", "0")
    assert load_settings(Settings, feedback_interval=5).feedback_interval == 5
    with pytest.raises(InvalidSettings, match=r"^SENDQUEUE_DATABASE_URL: expected sqlite"):
        load_settings(Settings, feedback_interval=5, database_url="mysql://h/db")


def test_bootstrap_from_the_environment_raises_the_sentences(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SENDQUEUE_STALE_POLICY", "maybe")
    with pytest.raises(InvalidSettings) as caught:
        bootstrap()
    assert caught.value.problems == ("SENDQUEUE_STALE_POLICY: must be 'retry' or 'fail'",)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


@pytest.mark.parametrize("kind", [LambdaSettings, LambdaControlSettings])
def test_a_lambda_cold_start_logs_each_sentence_and_keeps_nothing(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    kind: type[LambdaSettings],
) -> None:
    monkeypatch.setenv("SENDQUEUE_FEEDBACK_INTERVAL", "0")
    monkeypatch.setenv("SENDQUEUE_EXECUTION", "cron")
    caplog.set_level(logging.ERROR, logger="sendqueue.lambda_handlers")
    for _ in range(2):  # every invocation fails the same way until the settings are fixed
        caplog.clear()
        with pytest.raises(InvalidSettings):
            lambda_handlers.container(kind)
        assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
            (
                "ERROR",
                "invalid settings: SENDQUEUE_EXECUTION: must be 'embedded', 'procrastinate' or "
                "'eventbridge'",
            ),
            (
                "ERROR",
                "invalid settings: SENDQUEUE_FEEDBACK_INTERVAL: must be at least 1 and at most "
                "86400",
            ),
        ]
