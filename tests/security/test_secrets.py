"""Secrets never leak: the SMTP password (in ``SENDQUEUE_MAILER``), a database password, the
API token, session cookies and a webhook URL's secret path.

One full flow runs with every logger at DEBUG: log in with the token, create a campaign over
the API with the session cookie, provision it, send through a real SMTP server that requires
AUTH, a transient and a permanent SMTP error, a dead letter with the alarm webhook, the store
down (503), a wrong login. Afterwards none of the secrets (nor the base64 of the SMTP AUTH
exchange) may appear in the logs, in any response body or header seen (the login's
Set-Cookie aside), in ``/metrics``, in the repr or str of the settings, the container or its
adapters, or in what the CLI prints when the settings are refused.
"""

from __future__ import annotations

import base64
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sendqueue.bootstrap import Container, bootstrap
from sendqueue.cli import app as cli_app
from sendqueue.domain.errors import StoreUnavailable
from sendqueue.domain.lifecycle import TaskState
from sendqueue.services.importing.recipients import Templates
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.web.app import create_app
from sendqueue.web.session import SESSION_COOKIE
from tests.support.app import T0, open_policy
from tests.support.smtp import SmtpSink

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*install `httpx2`")
    from fastapi.testclient import TestClient

# Fixed (test ids must be the same in every xdist worker) and unlikely to occur by chance.
USER = "mailer-user"
SMTP_PASSWORD = "smtp-pw-Q7vX2kLp9w"
WRONG_PASSWORD = "wrong-pw-Z3nB8rTq5e"
DB_PASSWORD = "db-pw-H6mJ4sWc1y"
TOKEN = "api-token-K9dF2gNv7uPx3a"
HOOK_SECRET = "hook-R5tY8bMz2q"

# The test's own SMTP server logs the AUTH lines it receives: that is the sink, not sendqueue.
_SINK_LOGGERS = ("mail.log",)


def _auth_forms(user: str, password: str) -> list[str]:
    plain = base64.b64encode(f"\0{user}\0{password}".encode()).decode()
    return [password, plain, base64.b64encode(password.encode()).decode()]


def secrets_in(text: str, extra: list[str] | None = None) -> list[str]:
    """Which secrets appear in ``text``."""
    found = [
        s
        for s in [
            *_auth_forms(USER, SMTP_PASSWORD),
            *_auth_forms(USER, WRONG_PASSWORD),
            DB_PASSWORD,
            TOKEN,
            HOOK_SECRET,
            *(extra or []),
        ]
        if s and s in text
    ]
    return found


class Flow:
    """What the flow saw: response texts and headers, the session cookie, reprs."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.session: str | None = None

    def record(self, response: Any) -> Any:
        headers = [
            f"{k}: {v}" for k, v in response.headers.multi_items() if k.lower() != "set-cookie"
        ]
        self.seen.append("\n".join([*headers, response.text]))
        return response


@pytest.fixture
def sink(make_smtp_sink: Any) -> SmtpSink:
    sink: SmtpSink = make_smtp_sink(security="none", auth=(USER, SMTP_PASSWORD))
    return sink


def _settings(home: Path, sink: SmtpSink, password: str, **extra: Any) -> Settings:
    return Settings(
        _env_file=None,
        database_url=f"sqlite:///{home / 'store.db'}",
        scheduler_url=f"sqlite:///{home / 'scheduler.db'}",
        mailer=f"smtp://{USER}:{password}@127.0.0.1:{sink.port}?security=none&timeout=5",
        api_token=TOKEN,
        alarm_webhook=f"http://127.0.0.1:9/hooks/{HOOK_SECRET}?key={HOOK_SECRET}",
        default_timezone="UTC",
        max_attempts=2,
        retry_backoff=1,
        scheduler_retry_backoff=0,
        **extra,
    )


@pytest.fixture
def container(tmp_path: Path, sink: SmtpSink) -> Iterator[Container]:
    c = bootstrap(_settings(tmp_path, sink, SMTP_PASSWORD), clock=FakeClock(T0))
    yield c
    c.close()


def _log_text(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(
        f"{r.name} {r.getMessage()} {r.exc_text or ''} {r.args!r}"
        for r in caplog.records
        if not r.name.startswith(_SINK_LOGGERS)
    )


def test_no_secret_in_logs_responses_metrics_or_reprs(
    container: Container,
    sink: SmtpSink,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    flow = Flow()
    app = create_app(container)
    with TestClient(app, base_url="http://testserver", follow_redirects=False) as client:
        # a wrong login, then the right one: the session cookie
        flow.record(client.get("/login"))
        csrf = client.cookies["sq_csrf"]
        wrong = client.post("/login", data={"token": TOKEN[:-1] + "x", "csrf_token": csrf})
        assert flow.record(wrong).status_code == 401
        ok = client.post("/login", data={"token": TOKEN, "csrf_token": csrf})
        assert ok.status_code == 303
        flow.session = client.cookies[SESSION_COOKIE]
        assert flow.session
        csrf = client.cookies["sq_csrf"]  # login rotates it: the session's own token

        # create with the cookie, provision, send: one accepted, one 451 then accepted, one 550
        body = {
            "name": "secrets",
            "recipients": [{"email": f"r{i}@example.com"} for i in range(3)],
            "templates": {"subject": "Hello", "body": "Hi"},
            "policy": {"timezone": "UTC", "weekdays": "mon-sun", "windows": ["00:00-24:00"],
                       "per_day": 10000, "start": T0.isoformat()},
        }  # fmt: skip
        created = client.post("/api/campaigns", json=body, headers={"X-CSRF-Token": csrf})
        assert flow.record(created).status_code == 201, created.text
        cid = created.json()["id"]
        assert container.provisioner.provision(cid).status == "done"
        sink.reply_next("451 4.3.0 try again later", "550 5.1.1 no such user")
        # each due, none SENDQUEUE_MAX_LATENESS late; the 451 retries a minute on
        container.clock.advance(60)  # type: ignore[attr-defined]
        container.scheduler.fire_due(container.invoke)  # type: ignore[attr-defined]
        container.clock.advance(120)  # type: ignore[attr-defined]
        container.scheduler.fire_due(container.invoke)  # type: ignore[attr-defined]
        counts = container.store.count_tasks(cid)
        assert counts[TaskState.FINISHED] == 2 and counts[TaskState.FAILED] == 1, counts
        assert all(m.login == USER for m in sink.messages)  # it did log in

        # a dead letter raises the alarm (the webhook is unreachable: logged, not raised)
        scheduler: Any = container.scheduler
        scheduler.create("sq-x-1", "sq-x", T0.replace(tzinfo=None), "UTC", {"k": "v"}, "t", 0)

        def fail(_: Any) -> None:
            raise RuntimeError("the target failed")

        scheduler.fire_due(fail)
        container.alarm.flush(5.0)  # type: ignore[attr-defined]

        for path in (
            "/api/campaigns", f"/api/campaigns/{cid}", f"/api/campaigns/{cid}/tasks",
            "/api/dead-letters", "/metrics", "/", f"/campaigns/{cid}", "/dead-letters",
            "/campaigns/nope", "/api/campaigns/nope", "/openapi.json",
        ):  # fmt: skip
            flow.record(client.get(path, headers={"Accept": "text/html"}))
        metrics = client.get("/metrics").text
        assert "sendqueue_sends_total" in metrics
        # without credentials
        client.cookies.clear()
        flow.record(client.get("/api/campaigns"))
        flow.record(client.get("/api/campaigns", headers={"Authorization": "Bearer " + "x" * 20}))

    # the mailer with a wrong password: a permanent failure, logged
    wrong_home = tmp_path / "wrong"
    wrong_home.mkdir()
    other = bootstrap(_settings(wrong_home, sink, WRONG_PASSWORD), clock=FakeClock(T0))
    try:
        cid2 = other.campaign_import.create_from_rows(
            name="wrong",
            rows=[{"email": "a@example.com"}],
            policy=open_policy(),
            templates=Templates(subject="s", body="b"),
        ).campaign.id
        other.provisioner.provision(cid2)
        other.clock.advance(60)  # type: ignore[attr-defined]  # due, not too late to send
        other.scheduler.fire_due(other.invoke)  # type: ignore[attr-defined]
        (task,) = other.store.list_tasks(cid2)
        assert task.state is TaskState.FAILED
        assert task.error and "535" in task.error
        flow.seen.append(task.error)
        reprs = [repr(other.mailer), str(other.settings), repr(other.settings)]
    finally:
        other.close()

    # the store unreachable, with a password in its URL (a closed port: connection refused)
    pg = bootstrap(
        Settings(
            _env_file=None,
            database_url=f"postgresql+psycopg://u:{DB_PASSWORD}@127.0.0.1:9/sq?connect_timeout=2",
            scheduler_url=f"sqlite:///{tmp_path / 'pg-scheduler.db'}",
            api_token=TOKEN,
        )
    )
    try:
        with pytest.raises(StoreUnavailable) as down:
            pg.store.list_campaigns()
        flow.seen.append(str(down.value))
        reprs += [repr(pg.settings), str(pg.settings), repr(pg)]
    finally:
        pg.close()

    reprs += [
        repr(container.settings), str(container.settings), repr(container),
        repr(container.mailer), repr(container.store), repr(container.scheduler),
        repr(container.alarm), repr(container.settings.model_fields_set),
    ]  # fmt: skip
    logs = _log_text(caplog)
    # the failures were logged ...
    assert "failed login" in logs and "dead letter" in logs and "alarm webhook" in logs
    assert secrets_in(logs, [flow.session]) == []  # ... without a secret
    for text in flow.seen:
        assert secrets_in(text, [flow.session]) == [], text[:500]
    for text in reprs:
        assert secrets_in(text) == [], text
    assert secrets_in(metrics) == []


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SENDQUEUE_MAILER", f"smtp://{USER}:{SMTP_PASSWORD}@mail.example.com?security=bogus"),
        ("SENDQUEUE_MAILER", f"smtp://{USER}:{SMTP_PASSWORD}@mail.example.com?security=none"),
        ("SENDQUEUE_MAILER", f"smtp://{USER}:{SMTP_PASSWORD}@mail.example.com?timeout=x"),
        ("SENDQUEUE_MAILER", f"smtp://{USER}:{SMTP_PASSWORD}@mail.example.com:99999"),
        ("SENDQUEUE_DATABASE_URL", f"mysql://u:{DB_PASSWORD}@db.example.com/sq"),
        ("SENDQUEUE_API_TOKEN", TOKEN[:12]),  # too short: refused
        ("SENDQUEUE_ALARM_WEBHOOK", f"ftp://hooks.example.com/{HOOK_SECRET}"),
    ],
)
def test_refused_settings_are_named_without_their_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    for key in [k for k in os.environ if k.startswith("SENDQUEUE_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli_app, ["campaign", "list"], env={variable: value})
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert variable.removeprefix("SENDQUEUE_").lower() in message.lower()
    assert secrets_in(message, [TOKEN[:12]]) == [], message
    assert "Traceback" not in result.stderr


def test_an_unreachable_store_is_reported_without_its_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in [k for k in os.environ if k.startswith("SENDQUEUE_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    env = {
        "SENDQUEUE_DATABASE_URL": f"postgresql+psycopg://u:{DB_PASSWORD}@127.0.0.1:9/sq"
        "?connect_timeout=2",
    }
    result = CliRunner().invoke(cli_app, ["campaign", "list"], env=env)
    assert result.exit_code == 3, result.output
    assert "StoreUnavailable" in result.stderr
    assert secrets_in(result.stderr + result.stdout) == []
