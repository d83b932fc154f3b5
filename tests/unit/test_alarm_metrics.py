"""The metrics registry's text format, and the alarm's log line, counters and webhook."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sendqueue import metrics
from sendqueue.adapters.alarm import LoggingAlarm, dead_letter_document
from sendqueue.domain.models import DeadLetter
from sendqueue.metrics import Counter, Gauge, Histogram, Registry
from sendqueue.testing.alarm import RecordingAlarm

LETTER = DeadLetter(
    id="dl-1",
    schedule_name="sq-c1-7",
    group="c1",
    payload={"task_id": "c1-7"},
    error="StoreUnavailable: database is locked",
    attempts=3,
    failed_at=datetime(2026, 12, 1, 8, 0, tzinfo=UTC),
)


# --------------------------------------------------------------------------- metrics
def test_a_counter_renders_help_type_and_one_line_per_label_set() -> None:
    registry = Registry()
    sends = Counter("x_sends_total", "Sends by outcome.", ["outcome"], registry=registry)
    sends.inc(outcome="sent")
    sends.inc(2, outcome="sent")
    sends.inc(outcome="permanent")
    assert registry.render() == (
        "# HELP x_sends_total Sends by outcome.\n"
        "# TYPE x_sends_total counter\n"
        'x_sends_total{outcome="permanent"} 1.0\n'
        'x_sends_total{outcome="sent"} 3.0\n'
    )
    assert sends.value(outcome="sent") == 3.0
    assert sends.value(outcome="transient") == 0.0


def test_a_label_less_counter_is_exported_from_zero() -> None:
    registry = Registry()
    Counter("x_alarms_total", "Alarms.", registry=registry)
    assert registry.render().splitlines()[-1] == "x_alarms_total 0.0"


def test_label_values_and_help_are_escaped() -> None:
    registry = Registry()
    counter = Counter("x_total", 'Back\\slash\nand "quotes".', ["kind"], registry=registry)
    counter.inc(kind='a"b\\c\nd')
    lines = registry.render().splitlines()
    assert lines[0] == '# HELP x_total Back\\\\slash\\nand "quotes".'
    assert lines[2] == 'x_total{kind="a\\"b\\\\c\\nd"} 1.0'


def test_labels_must_match_the_declared_names() -> None:
    counter = Counter("x_total", "h", ["kind"], registry=Registry())
    with pytest.raises(ValueError, match="labels"):
        counter.inc()
    with pytest.raises(ValueError, match="labels"):
        counter.inc(kind="a", other="b")
    with pytest.raises(ValueError, match="only goes up"):
        counter.inc(-1, kind="a")


def test_a_histogram_renders_cumulative_buckets_sum_and_count() -> None:
    registry = Registry()
    lateness = Histogram("x_seconds", "Lateness.", [0.1, 1, 10], registry=registry)
    for value in (0.05, 0.1, 0.5, 3, 3, 42):
        lateness.observe(value)
    assert registry.render() == (
        "# HELP x_seconds Lateness.\n"
        "# TYPE x_seconds histogram\n"
        'x_seconds_bucket{le="0.1"} 2\n'
        'x_seconds_bucket{le="1.0"} 3\n'
        'x_seconds_bucket{le="10.0"} 5\n'
        'x_seconds_bucket{le="+Inf"} 6\n'
        "x_seconds_sum 48.65\n"
        "x_seconds_count 6\n"
    )
    assert lateness.count == 6
    assert lateness.sum == pytest.approx(48.65)


def test_a_gauge_goes_up_and_down() -> None:
    registry = Registry()
    gauge = Gauge("x_in_flight", "In flight.", registry=registry)
    gauge.set(5)
    gauge.inc(-2)
    assert gauge.value() == 3.0
    assert registry.render().endswith("# TYPE x_in_flight gauge\nx_in_flight 3.0\n")


def test_a_name_registers_once() -> None:
    registry = Registry()
    Counter("x_total", "h", registry=registry)
    with pytest.raises(ValueError, match="already registered"):
        Gauge("x_total", "h", registry=registry)


def test_counts_from_many_threads_add_up() -> None:
    counter = Counter("x_total", "h", ["t"], registry=Registry())

    def work() -> None:
        for _ in range(1000):
            counter.inc(t="a")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter.value(t="a") == 8000


def test_the_system_metrics_are_registered_with_their_types() -> None:
    text = metrics.render()
    for name, kind in [
        ("sendqueue_sends_total", "counter"),
        ("sendqueue_send_lateness_seconds", "histogram"),
        ("sendqueue_dead_letters_total", "counter"),
        ("sendqueue_reconciler_repairs_total", "counter"),
        ("sendqueue_alarms_total", "counter"),
    ]:
        assert f"# TYPE {name} {kind}\n" in text
    buckets = metrics.SEND_LATENESS_SECONDS.buckets
    assert buckets[0] == 0.05
    assert buckets[-2] == 600
    assert buckets[-1] == float("inf")
    assert 'sendqueue_send_lateness_seconds_bucket{le="600.0"}' in text


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


def test_the_alarm_counts_alarms_and_dead_letters() -> None:
    alarms = metrics.ALARMS_TOTAL.value()
    letters = metrics.DEAD_LETTERS_TOTAL.value()
    alarm = LoggingAlarm()
    alarm.raise_alarm(LETTER)
    alarm.raise_alarm(LETTER)
    assert metrics.ALARMS_TOTAL.value() == alarms + 2
    assert metrics.DEAD_LETTERS_TOTAL.value() == letters + 2


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
