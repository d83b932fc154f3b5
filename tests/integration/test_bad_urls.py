"""URLs refused at startup, not at the first use: a malformed PostgreSQL URL exits 2 with one
line naming ``SENDQUEUE_DATABASE_URL`` (it crashed with a traceback), and ``SENDQUEUE_MAILER``
is validated by the mailer's own parser (a URL the settings took used to dead-letter every
send)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner

from sendqueue.adapters.mail.factory import mailer_from_url
from sendqueue.domain.errors import InvalidField
from sendqueue.settings import Settings

BAD_POSTGRES = [
    "postgresql+psycopg://[bad",
    "postgresql+psycopg://user:secret-pw@localhost:99999/db",
    "postgresql+psycopg://user:secret-pw@localhost:abc/db",
    "postgresql://user:secret-pw@[::1:5432/db",
]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for key in list(os.environ):
        if key.startswith("SENDQUEUE_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    values = {
        "SENDQUEUE_DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}",
        "SENDQUEUE_SCHEDULER_URL": f"sqlite:///{tmp_path / 'scheduler.db'}",
        "SENDQUEUE_MAILER": f"maildir:{tmp_path / 'outbox'}",
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


def _one_line_naming(stderr: str, variable: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert variable in lines[0]
    assert "secret-pw" not in stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize("url", BAD_POSTGRES)
def test_a_malformed_postgres_url_exits_2_naming_the_variable(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    from sendqueue.cli import app

    monkeypatch.setenv("SENDQUEUE_DATABASE_URL", url)
    result = CliRunner().invoke(app, ["campaign", "list"])
    assert result.exit_code == 2, result.output
    _one_line_naming(result.stderr, "SENDQUEUE_DATABASE_URL")


@pytest.mark.parametrize("url", BAD_POSTGRES[:3])
def test_a_malformed_postgres_url_in_a_real_process(env: dict[str, str], url: str) -> None:
    process_env = {**os.environ, "SENDQUEUE_DATABASE_URL": url}
    process_env["PYTHONPATH"] = os.pathsep.join(sys.path)
    done = subprocess.run(
        [sys.executable, "-m", "sendqueue.cli", "campaign", "list"],
        env=process_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    _one_line_naming(done.stderr, "SENDQUEUE_DATABASE_URL")


def _settings(mailer: str) -> Settings:
    return Settings(_env_file=None, mailer=mailer)


@pytest.mark.parametrize(
    "mailer",
    [
        "smtp://mail.example.com:587/inbox",  # a path
        "smtp://mail.example.com:587#frag",  # a fragment
        "smtp://mail.example.com?security=tls&security=none",  # a repeated parameter
        "smtp://mail.example.com?timeout=5&timeout=6",
        "smtp://mail.example.com?colour=blue",  # an unknown parameter
        "smtp://mail.example.com?security",  # a parameter without '='
        "smtp://mail.example.com:0",  # port 0
        "smtp://mail.example.com:70000",
        "ses:eu-west-1?configuration_set=a&configuration_set=b",
        "ses:eu-west-1?region=eu-west-2",
        "ses:eu-west-1#x",
        "maildir:",
        "ftp://mail.example.com",
    ],
)
def test_a_mailer_url_the_mailer_would_refuse_is_refused_at_startup(mailer: str) -> None:
    with pytest.raises(InvalidField):
        mailer_from_url(mailer)
    with pytest.raises(ValidationError, match="SENDQUEUE_MAILER"):
        _settings(mailer)


def test_a_bad_mailer_url_exits_2_through_the_cli(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sendqueue.cli import app

    monkeypatch.setenv("SENDQUEUE_MAILER", "smtp://u:secret-pw@mail.example.com:587/inbox")
    result = CliRunner().invoke(app, ["campaign", "list"])
    assert result.exit_code == 2
    _one_line_naming(result.stderr, "SENDQUEUE_MAILER")


_PARAM = st.sampled_from(["security", "timeout", "configuration_set", "colour", ""])
_VALUE = st.sampled_from(["starttls", "tls", "none", "30", "0", "-1", "inf", "x", "", "1e3"])
_QUERY = st.lists(st.tuples(_PARAM, _VALUE), max_size=3).map(
    lambda pairs: "&".join(f"{k}={v}" if k else v for k, v in pairs)
)
_HOST = st.sampled_from(["mail.example.com", "127.0.0.1", "[::1]", "", "[bad", "h_x"])
_PORT = st.sampled_from(["", ":25", ":0", ":65535", ":65536", ":x", ":"])
_TAIL = st.sampled_from(["", "/", "/p", "#f", "/#", "?"])
_USER = st.sampled_from(["", "u@", "u:p@", ":p@", "u%40x:p%3A@"])


@st.composite
def mailer_urls(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["smtp", "ses", "maildir", "other"]))
    query = draw(_QUERY)
    if kind == "smtp":
        base = f"smtp://{draw(_USER)}{draw(_HOST)}{draw(_PORT)}{draw(_TAIL)}"
        return base + (f"?{query}" if query else "")
    if kind == "ses":
        region = draw(st.sampled_from(["", "eu-west-1", "EU", "us-east-2/x", "eu-west-1#f"]))
        return f"ses:{region}" + (f"?{query}" if query else "")
    if kind == "maildir":
        directory: str = draw(st.sampled_from(["", "outbox", "a/b"]))
        return "maildir:" + directory
    other: str = draw(st.text(max_size=20))
    return other


def _mailer_accepts(url: str) -> bool:
    try:
        mailer = mailer_from_url(url)
    except InvalidField:
        return False
    mailer.close()
    return True


def _settings_refusal(url: str) -> str | None:
    try:
        _settings(url)
    except ValidationError as exc:
        return str(exc)
    return None


# The fixtures set things that hold for every example: a region for SES, a scratch directory
# for relative Maildir paths.
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(url=mailer_urls())
def test_settings_accept_a_mailer_url_exactly_when_the_mailer_can_be_built(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.chdir(tmp_path)
    refusal = _settings_refusal(url)
    if refusal is not None:
        assert "SENDQUEUE_MAILER" in refusal
        if "unencrypted" in refusal:
            return  # the settings' one extra rule: no clear-text password to a remote host
    assert (refusal is None) == _mailer_accepts(url), (url, refusal)
