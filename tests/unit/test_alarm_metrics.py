"""The alarm's log line, events (the metrics' counters) and webhook."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sendqueue.adapters.alarm import LoggingAlarm, dead_letter_document
from sendqueue.adapters.metrics import PrometheusMetrics
from sendqueue.domain.models import DeadLetter
from sendqueue.testing.alarm import RecordingAlarm
from sendqueue.testing.events import RecordingEvents

LETTER = DeadLetter(
    id="dl-1",
    schedule_name="sq-c1-7",
    group="c1",
    payload={"task_id": "c1-7"},
    error="StoreUnavailable: database is locked",
    attempts=3,
    failed_at=datetime(2026, 12, 1, 8, 0, tzinfo=UTC),
)


# --------------------------------------------------------------------------- alarm
class _Hook(BaseHTTPRequestHandler):
    received: list[tuple[str, str, dict[str, object]]]
    arrived: threading.Event
    release: threading.Event
    released: list[bool]
    status: int

    def do_POST(self) -> None:
        cls = type(self)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls.received.append((self.path, self.headers["Content-Type"], body))
        cls.arrived.set()
        cls.released.append(cls.release.wait(10))
        self.send_response(cls.status)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[tuple[str, type[_Hook]]]:
    handler: type[_Hook] = type(
        "Hook",
        (_Hook,),
        {
            "received": [],
            "arrived": threading.Event(),
            "release": threading.Event(),
            "released": [],
            "status": 204,
        },
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook/secret-token", handler
    finally:
        handler.release.set()
        server.shutdown()
        server.server_close()


def test_the_alarm_logs_an_error_naming_schedule_payload_and_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="sendqueue.alarm"):
        LoggingAlarm().raise_alarm(LETTER)
    [record] = [r for r in caplog.records if r.name == "sendqueue.alarm"]
    assert record.levelno == logging.ERROR
    message = record.getMessage()
    assert "sq-c1-7" in message
    assert '"task_id": "c1-7"' in message
    assert "StoreUnavailable: database is locked" in message
    assert "3 attempt" in message


def test_the_alarm_tells_its_events_of_the_alarm_and_the_dead_letter() -> None:
    events = RecordingEvents()
    alarm = LoggingAlarm(events=events)
    alarm.raise_alarm(LETTER)
    alarm.raise_alarm(LETTER)
    assert events.alarms == [LETTER, LETTER]
    assert events.dead_letters == [LETTER, LETTER]


def test_the_alarm_counts_alarms_and_dead_letters_in_the_metrics() -> None:
    metrics = PrometheusMetrics()
    alarm = LoggingAlarm(events=metrics)
    alarm.raise_alarm(LETTER)
    alarm.raise_alarm(LETTER)
    assert metrics.value("sendqueue_alarms_total") == 2
    assert metrics.value("sendqueue_dead_letters_total") == 2


def test_the_alarm_posts_json_without_waiting_for_the_webhook(
    hook: tuple[str, type[_Hook]],
) -> None:
    url, handler = hook
    alarm = LoggingAlarm(url, timeout=10)
    alarm.raise_alarm(LETTER)
    # raise_alarm returned while the webhook still holds the request open: had it waited for
    # the response, the handler would have given up waiting for ``release``.
    assert handler.arrived.wait(10)
    handler.release.set()
    assert alarm.flush(10)
    assert handler.released == [True]
    [(path, content_type, body)] = handler.received
    assert path == "/hook/secret-token"
    assert content_type == "application/json"
    assert body == {
        "event": "dead_letter",
        "id": "dl-1",
        "schedule": "sq-c1-7",
        "group": "c1",
        "payload": {"task_id": "c1-7"},
        "error": "StoreUnavailable: database is locked",
        "attempts": 3,
        "failed_at": "2026-12-01T08:00:00+00:00",
    }
    assert body == dead_letter_document(LETTER)


def test_a_webhook_that_answers_an_error_is_logged_without_the_secret(
    hook: tuple[str, type[_Hook]], caplog: pytest.LogCaptureFixture
) -> None:
    url, handler = hook
    handler.status = 500
    handler.release.set()
    alarm = LoggingAlarm(url, timeout=10)
    alarm.raise_alarm(LETTER)
    assert alarm.flush(10)
    failures = [r.getMessage() for r in caplog.records if "webhook" in r.getMessage()]
    assert len(failures) == 1
    assert "500" in failures[0]
    assert "secret-token" not in failures[0]


def test_an_unreachable_webhook_never_raises_into_the_caller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    alarm = LoggingAlarm(f"http://127.0.0.1:{port}/x", timeout=2)
    alarm.raise_alarm(LETTER)
    alarm.raise_alarm(LETTER)
    assert alarm.flush(10)
    failures = [r for r in caplog.records if "webhook" in r.getMessage()]
    assert len(failures) == 2
    assert all(r.levelno == logging.ERROR for r in failures)


def test_the_recording_alarm_keeps_letters_in_order() -> None:
    alarm = RecordingAlarm()
    other = DeadLetter("dl-2", "sq-2", "c1", {}, "x", 1, LETTER.failed_at)
    alarm.raise_alarm(LETTER)
    alarm.raise_alarm(other)
    assert alarm.letters == [LETTER, other]
