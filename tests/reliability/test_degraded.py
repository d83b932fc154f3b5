"""Degraded mode: the task store down, the SMTP server down.

**Task store down.** Every route that needs the store answers 503 with ``Retry-After`` (the
routes are enumerated from the app, so a new one is covered without editing this test); the
send invocations fail, are retried by the execution layer and land in the dead-letter queue,
raising the alarm (an ERROR line and the alarm counter) for each; after recovery a redrive
delivers every email exactly once, nothing lost. Once with a wrapped store that raises
StoreUnavailable, once on a real PostgreSQL database that refuses connections.

**SMTP down** (a closed port). Each send fails transiently and is retried with the doubling
back-off (``SENDQUEUE_RETRY_BACKOFF``, then twice that), never outside the campaign's windows
(a retry that would fall after the window waits for the next sending day); after the last
attempt the email is Failed, and after ``SENDQUEUE_AUTO_PAUSE_AFTER`` failed emails in a row
the campaign pauses itself and says why, in the API and in ``sendqueue campaign show``. Once
the server is back, resume and retry-failed deliver every email.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from typer.testing import CliRunner

from sendqueue.adapters.mail.smtp import SmtpMailer
from sendqueue.adapters.sql import open_store
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.cli import app as cli_app
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import schedule_group
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.tokens import TokenPurpose, sign_task
from sendqueue.ports import OutgoingMessage
from sendqueue.services.importing.recipients import Templates
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.web.app import create_app
from tests.conftest import POSTGRES_ADMIN_URL
from tests.security.test_access import routes
from tests.support.app import T0, csv_bytes, open_policy
from tests.support.smtp import SmtpSink
from tests.web.conftest import FlakyStore

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*install `httpx2`")
    from fastapi.testclient import TestClient

#: Routes that answer without the task store: the docs, the login form, the metrics, the
#: dead letters (the execution layer's), and the preview of a new campaign (it validates and
#: plans in memory). ``/healthz`` is store-backed but answers 503 in its own shape.
STORE_FREE = {
    "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/login", "/logout",
    "/metrics", "/api/dead-letters", "/api/dead-letters/redrive",
    "/api/dead-letters/{letter_id}/redrive", "/api/campaigns/preview", "/dead-letters",
    "/campaigns/new",
}  # fmt: skip

BODY = {
    "name": "degraded",
    "recipients": [{"email": "ada@example.com"}],
    "templates": {"subject": "s", "body": "b"},
}


#: The key that signs the unsubscribe links the checks below follow.
LINK_KEY = "degraded-test-unsubscribe-key-0123456789"


def _settings(home: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "_env_file": None,
        "database_url": f"sqlite:///{home / 'store.db'}",
        "scheduler_url": f"sqlite:///{home / 'scheduler.db'}",
        "mailer": f"maildir:{home / 'outbox'}",
        "default_timezone": "UTC",
        "scheduler_retry_backoff": 5.0,
        "auto_pause_after": 0,
        # the unsubscribe routes answer a genuine link from the store (a forged one: 404 at once)
        "public_url": "https://mail.example.com",
        "secret_key": LINK_KEY,
    }
    values.update(overrides)
    return Settings(**values)


#: The requests of routes whose input is not a campaign's: valid, so they reach the store.
REQUESTS: dict[str, dict[str, Any]] = {
    "/api/suppressions": {"json": {"email": "ada@example.com"}},
    "/api/suppressions/import": {
        "files": {"file": ("s.csv", b"email\nada@example.com\n", "text/csv")}
    },
    "/u/{token}": {"data": {"List-Unsubscribe": "One-Click"}},
    "/api/senders": {"json": {"email": "ada@example.com"}},
    "/api/senders/{ref:path}": {"json": {"daily_cap": 5}},
    "/api/webhooks": {"json": {"url": "https://hooks.example.com/sendqueue"}},
    "/api/webhooks/{endpoint_id}": {"json": {"enabled": False}},
    "/api/webhooks/{endpoint_id}/redeliver": {"json": {"events": ["evt_1"]}},
    "/api/campaigns/{campaign_id}/steps": {"json": {"text": "more", "after": "2d"}},
    "/api/campaigns/{campaign_id}/steps/{number}": {"json": {"text": "more"}},
}


def _concrete(path: str, campaign_id: str) -> str:
    path = path.replace("{task_id}", f"{campaign_id}-0").replace("{email:path}", "a@example.com")
    path = path.replace("{number}", "1")  # a step
    token = sign_task(f"{campaign_id}-0", LINK_KEY, TokenPurpose.UNSUBSCRIBE)
    path = path.replace("{token}", token)
    return re.sub(r"\{[^}]+\}", campaign_id, path)


def assert_503_on_every_store_backed_route(app: Any, client: TestClient, cid: str) -> int:
    """Call every route with the store down; returns how many were store-backed."""
    checked = 0
    for method, path in routes(app):
        if path in STORE_FREE:
            continue
        for accept in ("application/json", "text/html"):
            request = REQUESTS.get(path, {"json": BODY} if method == "POST" else {})
            response = client.request(
                method, _concrete(path, cid), headers={"Accept": accept}, **request
            )
            assert response.status_code == 503, (method, path, accept, response.status_code)
            assert response.headers["retry-after"] == "5", (method, path)
            if "json" in response.headers.get("content-type", ""):
                data = response.json()
                error = data["error"]
                assert "StoreUnavailable" in error["message"] or data.get("status") == "unavailable"
        checked += 1
    return checked


def _dead_letter_and_recover(
    app: Container, clock: FakeClock, cids: list[str], set_down: Any, caplog: Any
) -> None:
    """Fire the due sends with the store down until every one is a dead letter; then bring
    the store back, redrive, and check every email went out exactly once."""
    scheduler: Any = app.scheduler
    tasks = [t for cid in cids for t in app.store.list_tasks(cid)]
    alarms_before = app.metrics.value("sendqueue_alarms_total")
    set_down(True)
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(8):  # the first attempt and two retries, with room to spare
                clock.advance(3600)
                scheduler.fire_due(app.invoke)
        letters = scheduler.dead_letters()
    finally:
        set_down(False)
    assert sorted(d.payload["task_id"] for d in letters) == sorted(t.id for t in tasks)
    assert all(d.attempts == 3 for d in letters)  # the first invocation and two retries
    assert all("StoreUnavailable" in d.error for d in letters)
    assert app.metrics.value("sendqueue_alarms_total") == alarms_before + len(tasks)
    alarm_lines = [r for r in caplog.records if r.name == "sendqueue.alarm"]
    assert len(alarm_lines) == len(tasks) and all(r.levelno == logging.ERROR for r in alarm_lines)
    # retried first: WARNING lines for the failed attempts before the dead letter
    assert sum("retrying" in r.getMessage() for r in caplog.records) == 2 * len(tasks)
    for cid in cids:  # nothing was claimed: the store refused even the read
        assert app.store.count_tasks(cid)[TaskState.PENDING] == len(app.store.list_tasks(cid))

    for letter in letters:
        scheduler.redrive(letter.id)
    clock.advance(1)
    scheduler.fire_due(app.invoke)
    assert scheduler.dead_letters() == []
    # Hours past their send time, the redriven emails are not sent late: they are moved to
    # the next free slots of their campaigns, and go out there.
    for cid in cids:
        for task in app.store.list_tasks(cid):
            assert task.state is TaskState.PENDING and task.send_at >= clock.now()
            # the worker ran and met the store down: the reason names the store, not the worker
            reason = task.moved_reason or ""
            assert task.moves == 1 and reason.startswith("store unreachable "), reason
    for _ in range(len(tasks)):
        pending = [
            t for cid in cids for t in app.store.list_tasks(cid) if t.state is TaskState.PENDING
        ]
        if not pending:
            break
        clock.set(max(clock.now(), min(t.send_at for t in pending)))
        scheduler.fire_due(app.invoke)
    for cid in cids:
        assert app.store.count_tasks(cid)[TaskState.FINISHED] == len(app.store.list_tasks(cid))
        assert app.store.get_campaign(cid).state is CampaignState.COMPLETED


def test_store_down_503_everywhere_then_dead_letters_then_redrive_loses_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _settings(tmp_path)
    store = FlakyStore(open_store(settings.database_url, upgrade=True))
    clock = FakeClock(T0)
    mailer = RecordingMailer()
    app = bootstrap(settings, clock=clock, store=store, mailer=mailer)
    try:
        with TestClient(create_app(app), raise_server_exceptions=False) as client:
            created = client.post("/api/campaigns", json=BODY)
            assert created.status_code == 201
            cid = created.json()["id"]
            store.down = True
            checked = assert_503_on_every_store_backed_route(client.app, client, cid)
            assert checked >= 15
            health = client.get("/healthz")
            assert (health.status_code, health.headers["retry-after"]) == (503, "5")
            assert health.json()["status"] == "unavailable"
            store.down = False
            assert client.get("/healthz").json() == {"status": "ok"}

        cids = [cid]
        for n in (2, 3):
            cids.append(
                app.campaign_import.create(
                    name=f"more {n}", recipients=csv_bytes(n), policy=open_policy(),
                    templates=Templates(),
                ).campaign.id
            )  # fmt: skip
        for c in cids:
            assert app.provisioner.provision(c).status == "done"

        def set_down(down: bool) -> None:
            store.down = down

        _dead_letter_and_recover(app, clock, cids, set_down, caplog)
        sent = [m.headers["X-Sendqueue-Task"] for m in mailer.sent]
        assert sorted(sent) == sorted({t.id for c in cids for t in app.store.list_tasks(c)})
    finally:
        app.close()


# -- a real PostgreSQL outage --------------------------------------------------------------------


def _allow_connections(database: str, allow: bool) -> None:
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS {str(allow).lower()}')
        if not allow:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (database,),
            )


@pytest.mark.postgres
def test_postgresql_outage_503_everywhere_then_dead_letters_then_redrive_loses_nothing(
    tmp_path: Path, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    database = postgres_url.rsplit("/", 1)[1]
    clock = FakeClock(T0)
    mailer = RecordingMailer()
    app = bootstrap(_settings(tmp_path, database_url=postgres_url), clock=clock, mailer=mailer)
    try:
        with TestClient(create_app(app), raise_server_exceptions=False) as client:
            created = client.post("/api/campaigns", json=BODY)
            assert created.status_code == 201, created.text
            cid = created.json()["id"]
            _allow_connections(database, False)
            try:
                assert assert_503_on_every_store_backed_route(client.app, client, cid) >= 15
                assert client.get("/healthz").status_code == 503
            finally:
                _allow_connections(database, True)
            assert client.get("/healthz").json() == {"status": "ok"}
        cids = [cid]
        cids.append(
            app.campaign_import.create(
                name="more", recipients=csv_bytes(3), policy=open_policy(), templates=Templates()
            ).campaign.id
        )
        for c in cids:
            assert app.provisioner.provision(c).status == "done"
        _dead_letter_and_recover(
            app, clock, cids, lambda down: _allow_connections(database, not down), caplog
        )
        assert len(mailer.sent) == 4
    finally:
        app.close()


# -- the SMTP server down --------------------------------------------------------------------------

#: Tuesday 2026-12-01, 16:50 in Berlin: ten minutes of window left today.
LATE = datetime(2026, 12, 1, 15, 50, tzinfo=UTC)


def _windowed(start: datetime) -> SendingPolicy:
    return SendingPolicy(
        timezone="Europe/Berlin",
        per_day=10_000,
        weekdays=frozenset(range(5)),
        windows=(Window(9 * 60, 17 * 60),),
        start=start,
    )


BERLIN = ZoneInfo("Europe/Berlin")


def run_until(app: Container, clock: FakeClock, cid: str, state: CampaignState) -> None:
    """Fire the campaign's schedules one due time after another (as the dispatcher would)
    until the campaign reaches ``state``."""
    scheduler: Any = app.scheduler
    for _ in range(100):
        if app.store.get_campaign(cid).state is state:
            return
        due = [s.due_at for s in scheduler.list(schedule_group(cid))]
        assert due, f"nothing scheduled, campaign {app.store.get_campaign(cid).state}"
        clock.set(max(clock.now(), min(due)))
        scheduler.fire_due(app.invoke)
    raise AssertionError(f"campaign never became {state}")


def assert_claims_inside_the_windows(app: Container, cid: str) -> None:
    """Every attempt (a claim: Pending -> Running) happened on a weekday, 09:00-17:00 Berlin."""
    claims = [
        e for e in app.store.changes_after(0, campaign_id=cid, limit=10_000)
        if e.to_state == TaskState.RUNNING.value
    ]  # fmt: skip
    assert claims
    for entry in claims:
        local = entry.at.astimezone(BERLIN)
        assert local.weekday() < 5 and time(9) <= local.time() < time(17), entry


class SwitchableMailer:
    """A real SMTP mailer whose server can be swapped: down first, back later."""

    def __init__(self, port: int) -> None:
        self.inner = SmtpMailer("127.0.0.1", port, security="none", timeout=5)

    def point_at(self, port: int) -> None:
        self.inner.close()
        self.inner = SmtpMailer("127.0.0.1", port, security="none", timeout=5)

    def send(self, message: OutgoingMessage) -> str:
        return self.inner.send(message)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def down_smtp(
    tmp_path: Path, closed_port: int
) -> Iterator[tuple[Container, FakeClock, SwitchableMailer]]:
    clock = FakeClock(LATE)
    mailer = SwitchableMailer(closed_port)
    app = bootstrap(
        _settings(
            tmp_path,
            mailer=f"smtp://127.0.0.1:{closed_port}?security=none&timeout=5",
            retry_backoff=60,
            max_attempts=3,
            auto_pause_after=2,
            # the test fires sends up to ten minutes late, to make their retries fall after
            # the window; late sends being moved instead is tested in tests/unit/test_catch_up
            max_lateness=3600,
            space_late_sends=False,
        ),
        clock=clock,
        mailer=mailer,
    )
    yield app, clock, mailer
    app.close()


def test_smtp_down_retries_with_backoff_inside_the_windows_then_auto_pauses_and_says_why(
    down_smtp: tuple[Container, FakeClock, SwitchableMailer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app, clock, _ = down_smtp
    scheduler: Any = app.scheduler
    cid = app.campaign_import.create(
        name="smtp down", recipients=csv_bytes(4), policy=_windowed(LATE), templates=Templates()
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    first = min(t.send_at for t in app.store.list_tasks(cid))
    assert LATE <= first < LATE + timedelta(seconds=10)  # the four share the last 10 minutes

    # attempt 1 of the first email fails: back to Pending, due again after 60 s
    clock.set(first)
    scheduler.fire_due(app.invoke)
    task = app.store.get_task(f"{cid}-0")
    assert task is not None
    assert (task.state, task.attempts) == (TaskState.PENDING, 1)
    assert task.error is not None and task.error.startswith("transient:")
    # the first free slot of the grid (every 2.88 s) after the back-off, away from the others
    slack = timedelta(seconds=6)
    assert first + timedelta(seconds=60) <= task.send_at < first + timedelta(seconds=60) + slack
    assert task.moves == 1 and (task.moved_reason or "").startswith("transient:")

    # attempt 2 fails: due again after 120 s (doubled)
    clock.set(task.send_at)
    scheduler.fire_due(app.invoke)
    task = app.store.get_task(f"{cid}-0")
    assert task is not None
    assert (task.state, task.attempts) == (TaskState.PENDING, 2)
    after = clock.now() + timedelta(seconds=120)
    assert after <= task.send_at < after + slack

    # the window closes at 17:00 Berlin: a retry that would fall after it takes the first free
    # slots at 09:00 on the next sending day (Wednesday), never at night
    clock.set(datetime(2026, 12, 1, 15, 59, 30, tzinfo=UTC))
    scheduler.fire_due(app.invoke)
    late = [t for t in app.store.list_tasks(cid) if t.attempts and t.send_at.day == 2]
    assert late, [(t.id, t.attempts, t.send_at) for t in app.store.list_tasks(cid)]
    wednesday = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)  # 09:00 Berlin
    for t in late:
        assert wednesday <= t.send_at < wednesday + slack * len(late)
    for t in app.store.list_tasks(cid):
        local = t.send_at.astimezone(_windowed(LATE).zone)
        assert t.state is not TaskState.PENDING or 9 <= local.hour < 17, t

    # keep firing, each schedule at its time: emails exhaust their attempts, and two Failed
    # in a row pause the campaign
    run_until(app, clock, cid, CampaignState.PAUSED)
    assert_claims_inside_the_windows(app, cid)
    campaign = app.store.get_campaign(cid)
    assert campaign.state is CampaignState.PAUSED
    assert campaign.state_reason is not None
    assert campaign.state_reason.startswith("auto-paused after 2 failed sends in a row")
    assert "gave up after 3 attempts" in campaign.state_reason
    assert "Connection" in campaign.state_reason or "refused" in campaign.state_reason
    counts = app.store.count_tasks(cid)
    assert counts[TaskState.FAILED] == 2
    assert counts[TaskState.PENDING] == 2
    assert scheduler.list(schedule_group(cid)) == []  # paused: no schedule left to fire
    failed = app.store.list_tasks(cid, state=TaskState.FAILED)
    assert all(t.attempts == 3 and "gave up after 3 attempts" in (t.error or "") for t in failed)

    # visible in the API ...
    with TestClient(create_app(app)) as client:
        data = client.get(f"/api/campaigns/{cid}").json()
    assert data["state"] == "paused"
    assert data["state_reason"] == campaign.state_reason
    # ... and in `sendqueue campaign show`
    for key in [k for k in os.environ if k.startswith("SENDQUEUE_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    env = {
        "SENDQUEUE_DATABASE_URL": app.settings.database_url,
        "SENDQUEUE_SCHEDULER_URL": app.settings.scheduler_url,
    }
    shown = CliRunner().invoke(cli_app, ["campaign", "show", cid], env=env)
    assert shown.exit_code == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "is paused" in text
    assert "reason: auto-paused after 2 failed sends in a row" in text


def test_after_the_smtp_server_is_back_resume_and_retry_failed_deliver_everything(
    down_smtp: tuple[Container, FakeClock, SwitchableMailer], smtp_sink: SmtpSink
) -> None:
    app, clock, mailer = down_smtp
    cid = app.campaign_import.create(
        name="smtp back", recipients=csv_bytes(4), policy=_windowed(LATE), templates=Templates()
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    run_until(app, clock, cid, CampaignState.PAUSED)

    mailer.point_at(smtp_sink.port)  # the server is back
    clock.advance(hours=1)  # 17:5x Berlin: resumed after the window, sends wait for 09:00
    app.campaign_controls.resume(cid)
    assert app.campaign_controls.retry_failed(cid) == 2
    run_until(app, clock, cid, CampaignState.COMPLETED)
    assert app.store.count_tasks(cid)[TaskState.FINISHED] == 4
    received = sorted(m.rcpt_tos[0] for m in smtp_sink.wait_for(4))
    assert received == [f"user{i}@example.com" for i in range(4)]  # each once, none lost
    assert len(smtp_sink.messages) == 4
    assert_claims_inside_the_windows(app, cid)
    for t in app.store.list_tasks(cid):
        assert t.sent_at is not None and t.sent_at >= t.send_at
        assert t.sent_at.astimezone(BERLIN).date() == date(2026, 12, 2)  # Wednesday morning
