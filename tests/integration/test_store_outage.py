"""The task store goes down during a send (real PostgreSQL refusing connections): the
invocation is retried, lands in the dead-letter queue, the alarm fires (log, counter, webhook),
and a redrive after the outage delivers the email."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sendqueue.domain.lifecycle import TaskState
from sendqueue.services.campaigns.demo import demo_csv, demo_policy
from sendqueue.services.importing.recipients import Templates
from tests.conftest import POSTGRES_ADMIN_URL
from tests.support.real import all_final, real_app, running_worker, wait_until
from tests.support.smtp import SmtpSink

pytestmark = pytest.mark.postgres


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(json.loads(body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/alarm", received
    server.shutdown()
    server.server_close()


def _set_outage(database: str, down: bool) -> None:
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS {"false" if down else "true"}')
        if down:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (database,),
            )


def test_store_outage_dead_letters_raises_the_alarm_and_redrive_completes(
    tmp_path: Path,
    smtp_sink: SmtpSink,
    postgres_url: str,
    webhook: tuple[str, list[dict[str, Any]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    hook_url, posts = webhook
    database = postgres_url.rsplit("/", 1)[1]
    app = real_app(
        tmp_path,
        smtp_sink.url(),
        database_url=postgres_url,
        alarm_webhook=hook_url,
        scheduler_retry_backoff=0.2,
    )
    cid = app.campaign_import.create(
        name="outage",
        recipients=demo_csv(1),
        policy=demo_policy(app.clock.now(), "UTC", 1, 1),
        templates=Templates(subject="s", body="b"),
    ).campaign.id
    app.provisioner.provision(cid)
    (task,) = app.store.list_tasks(cid)
    alarms_before = app.metrics.value("sendqueue_alarms_total")
    _set_outage(database, down=True)
    try:
        with caplog.at_level(logging.ERROR), running_worker(app):
            wait_until(lambda: len(app.scheduler.dead_letters()) == 1, 30, "a dead letter")
            wait_until(lambda: len(posts) == 1, 10, "the webhook POST")
    finally:
        _set_outage(database, down=False)
    (letter,) = app.scheduler.dead_letters()
    assert letter.attempts == 3  # the first invocation and two retries
    assert letter.payload["task_id"] == task.id
    assert "StoreUnavailable" in letter.error or "store" in letter.error.lower()
    assert posts[0]["event"] == "dead_letter" and posts[0]["payload"]["task_id"] == task.id
    assert app.metrics.value("sendqueue_alarms_total") == alarms_before + 1
    assert any(r.levelno == logging.ERROR and task.id in r.getMessage() for r in caplog.records)
    assert smtp_sink.messages == []
    assert app.store.get_task(task.id).state is TaskState.PENDING  # type: ignore[union-attr]

    app.scheduler.redrive(letter.id)
    with running_worker(app):
        wait_until(lambda: all_final(app, cid), 30, "the redriven send")
    assert app.store.get_task(task.id).state is TaskState.FINISHED  # type: ignore[union-attr]
    assert len(smtp_sink.messages) == 1
    assert app.scheduler.dead_letters() == []
    app.close()
