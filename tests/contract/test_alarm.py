"""The Alarm contract (sendqueue.ports.Alarm), run against every adapter.

Every adapter: ``raise_alarm`` returns normally for every letter (a dispatcher that raises the
alarm must never fail because of it), makes each letter visible exactly once, and is safe from
several threads. What "visible" means is the adapter's own: the fake records the letter, the
logging alarm writes an ERROR line naming it, the webhook alarm also POSTs its JSON document.

The logging adapters (``logging``, ``webhook``, ``webhook-down``) also count every letter in
the metrics; the webhook ones post to a real HTTP server on 127.0.0.1 (``webhook-down`` to a
port where nothing listens, which must never reach the caller). The fake does neither.

To add an adapter, add a builder to ``BUILDERS`` returning a :class:`Harness`.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sendqueue.adapters.alarm import LoggingAlarm
from sendqueue.adapters.metrics import PrometheusMetrics
from sendqueue.domain.alarms import AutoPause, auto_pause_reason
from sendqueue.domain.models import DeadLetter
from sendqueue.ports import Alarm, FlushableAlarm
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

LOGGER = "sendqueue.alarm"

#: The metrics the logging adapters report to (the counters /metrics shows).
METRICS = PrometheusMetrics()


@dataclass
class Harness:
    alarm: Alarm
    #: The ids of the letters the adapter made visible, in order; waits for background work.
    seen: Callable[[], list[str]]
    #: The JSON documents the webhook received, when the adapter posts to one that is up.
    posted: Callable[[], list[dict[str, object]]] | None = None


@dataclass
class _Hook:
    """A webhook receiver on 127.0.0.1 recording the JSON bodies POSTed to it."""

    bodies: list[dict[str, object]] = field(default_factory=list)
    content_types: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _webhook_server(hook: _Hook) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with hook.lock:
                hook.bodies.append(body)
                hook.content_types.add(self.headers["Content-Type"])
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


def _logged_ids(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The letter ids of the alarm's ERROR lines ("dead letter <id>: ...")."""
    return [
        str(record.args[0])
        for record in caplog.records
        if record.name == LOGGER
        and record.levelno == logging.ERROR
        and isinstance(record.args, tuple)
        and str(record.msg).startswith("dead letter %s:")
    ]


def _fake(caplog: pytest.LogCaptureFixture) -> Iterator[Harness]:
    alarm = RecordingAlarm()
    yield Harness(alarm, lambda: [letter.id for letter in alarm.letters])


def _logging(caplog: pytest.LogCaptureFixture) -> Iterator[Harness]:
    yield Harness(LoggingAlarm(events=METRICS), lambda: _logged_ids(caplog))


def _webhook(caplog: pytest.LogCaptureFixture) -> Iterator[Harness]:
    hook = _Hook()
    server = _webhook_server(hook)
    alarm = LoggingAlarm(
        f"http://127.0.0.1:{server.server_address[1]}/hook/token", timeout=10, events=METRICS
    )

    def posted() -> list[dict[str, object]]:
        assert alarm.flush(30), "the webhook posts did not finish"
        with hook.lock:
            assert hook.content_types <= {"application/json"}
            return list(hook.bodies)

    def seen() -> list[str]:
        ids = _logged_ids(caplog)
        assert [str(body["id"]) for body in posted()] == ids
        return ids

    try:
        yield Harness(alarm, seen, posted=posted)
    finally:
        alarm.flush(30)
        server.shutdown()
        server.server_close()


def _webhook_down(caplog: pytest.LogCaptureFixture) -> Iterator[Harness]:
    with socket.socket() as probe:  # a port where nothing listens: connection refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    alarm = LoggingAlarm(f"http://127.0.0.1:{port}/hook/token", timeout=2, events=METRICS)

    def seen() -> list[str]:
        assert alarm.flush(30), "the webhook attempts did not finish"
        return _logged_ids(caplog)

    yield Harness(alarm, seen)
    alarm.flush(30)


BUILDERS: dict[str, Callable[[pytest.LogCaptureFixture], Iterator[Harness]]] = {
    "fake": _fake,
    "logging": _logging,
    "webhook": _webhook,
    "webhook-down": _webhook_down,
}


def _build(name: str, caplog: pytest.LogCaptureFixture) -> Iterator[Harness]:
    caplog.set_level(logging.ERROR, logger=LOGGER)
    yield from BUILDERS[name](caplog)


@pytest.fixture(params=sorted(BUILDERS))
def harness(request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture) -> Iterator[Harness]:
    yield from _build(request.param, caplog)


@pytest.fixture(params=sorted(name for name in BUILDERS if name != "fake"))
def logging_harness(
    request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> Iterator[Harness]:
    """The adapters that log and count (the fake records letters instead)."""
    yield from _build(request.param, caplog)


@pytest.fixture
def webhook_harness(caplog: pytest.LogCaptureFixture) -> Iterator[Harness]:
    yield from _build("webhook", caplog)


@pytest.fixture
def down_harness(caplog: pytest.LogCaptureFixture) -> Iterator[Harness]:
    yield from _build("webhook-down", caplog)


def letter(n: int) -> DeadLetter:
    return replace(LETTER, id=f"dl-{n}", schedule_name=f"sq-c1-{n}", payload={"task_id": f"c1-{n}"})


def counts() -> tuple[float, float]:
    """The alarm and dead-letter counters, as /metrics reports them."""
    return METRICS.value("sendqueue_alarms_total"), METRICS.value("sendqueue_dead_letters_total")


# --- every adapter ----------------------------------------------------------------------------


def test_raise_alarm_returns_none_and_makes_the_letter_visible(harness: Harness) -> None:
    assert harness.alarm.raise_alarm(LETTER) is None  # type: ignore[func-returns-value]
    assert harness.seen() == ["dl-1"]


def test_every_letter_is_visible_once_in_order(harness: Harness) -> None:
    for n in range(1, 6):
        harness.alarm.raise_alarm(letter(n))
    assert harness.seen() == [f"dl-{n}" for n in range(1, 6)]


def test_odd_letters_never_raise(harness: Harness) -> None:
    odd = [
        replace(LETTER, id="dl-empty", payload={}, error="", attempts=0),
        replace(LETTER, id="dl-unicode", error="Zoë's server said «nein» 日本語\n  traceback"),
        replace(LETTER, id="dl-big", error="x" * 100_000, payload={"task_id": "t" * 500}),
    ]
    for one in odd:
        harness.alarm.raise_alarm(one)
    assert harness.seen() == ["dl-empty", "dl-unicode", "dl-big"]


def test_raise_alarm_is_safe_from_several_threads(harness: Harness) -> None:
    letters = [letter(n) for n in range(100)]
    with ThreadPoolExecutor(4) as pool:  # an alarm that raises re-raises here
        assert list(pool.map(harness.alarm.raise_alarm, letters)) == [None] * len(letters)
    assert sorted(harness.seen()) == sorted(one.id for one in letters)


# --- the logging adapters ---------------------------------------------------------------------


def test_the_error_line_names_schedule_group_payload_attempts_and_error(
    logging_harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    logging_harness.alarm.raise_alarm(LETTER)
    logging_harness.seen()
    [line] = [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and r.getMessage().startswith("dead letter dl-1:")
    ]
    for part in ("sq-c1-7", "group c1", "3 attempt", '"task_id": "c1-7"', "database is locked"):
        assert part in line


def test_every_letter_is_counted(logging_harness: Harness) -> None:
    alarms, letters = counts()
    for n in range(3):
        logging_harness.alarm.raise_alarm(letter(n))
    logging_harness.seen()
    assert counts() == (alarms + 3, letters + 3)


def test_the_webhook_receives_the_letter_as_json(webhook_harness: Harness) -> None:
    assert webhook_harness.posted is not None
    webhook_harness.alarm.raise_alarm(LETTER)
    assert webhook_harness.posted() == [
        {
            "event": "dead_letter",
            "id": "dl-1",
            "schedule": "sq-c1-7",
            "group": "c1",
            "payload": {"task_id": "c1-7"},
            "error": "StoreUnavailable: database is locked",
            "attempts": 3,
            "failed_at": "2026-12-01T08:00:00+00:00",
        }
    ]


def test_a_webhook_that_is_down_is_logged_and_never_raised(
    down_harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    alarms, _ = counts()
    down_harness.alarm.raise_alarm(LETTER)
    down_harness.alarm.raise_alarm(letter(2))
    assert down_harness.seen() == ["dl-1", "dl-2"]
    failures = [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and r.getMessage().startswith("alarm webhook to")
    ]
    assert len(failures) == 2
    assert all("token" not in failure for failure in failures)  # the URL's secret path
    assert counts()[0] == alarms + 2


# --- auto-pauses --------------------------------------------------------------------------------

PAUSE = AutoPause(
    "c1",
    "Winter sale",
    auto_pause_reason(5, "permanent: 550 rejected"),
    datetime(2026, 12, 1, 8, 5, tzinfo=UTC),
)


def test_an_auto_pause_never_raises_and_is_counted(harness: Harness) -> None:
    alarms, letters = counts()
    assert harness.alarm.auto_paused(PAUSE) is None  # type: ignore[func-returns-value]
    if isinstance(harness.alarm, FlushableAlarm):
        assert harness.alarm.flush(30)
    if isinstance(harness.alarm, RecordingAlarm):
        assert harness.alarm.pauses == [PAUSE]
    else:
        assert counts() == (alarms + 1, letters)  # an alarm, not a dead letter


def test_the_webhook_receives_an_auto_pause_as_json(webhook_harness: Harness) -> None:
    assert webhook_harness.posted is not None
    webhook_harness.alarm.auto_paused(PAUSE)
    assert webhook_harness.posted() == [
        {
            "event": "auto_pause",
            "campaign_id": "c1",
            "campaign_name": "Winter sale",
            "reason": "auto-paused after 5 failed sends in a row; last error: permanent: 550 "
            "rejected",
            "paused_at": "2026-12-01T08:05:00+00:00",
        }
    ]
