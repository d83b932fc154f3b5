"""The embedded dispatcher in real time: real threads, real subprocesses, a real SQLite file.

Timing is the behaviour under test here, so some assertions bound it, with generous margins.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sendqueue.adapters.alarm import LoggingAlarm
from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler
from sendqueue.domain.errors import SchedulerError
from sendqueue.ports import Target
from sendqueue.testing.alarm import RecordingAlarm
from sendqueue.testing.clock import FakeClock

pytestmark = pytest.mark.slow

# Runs a dispatcher until SIGTERM/SIGINT, the way the CLI's worker does. Its target marks
# ``started-<task>``, blocks for ``block`` seconds, then marks ``done-<task>``.
DISPATCHER_SCRIPT = """
import signal, sys, threading, time
from pathlib import Path
from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler

url, marks, lease, block = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
signal.signal(signal.SIGINT, lambda *_: stop.set())

def target(payload):
    (marks / ("started-" + payload["task_id"])).touch()
    time.sleep(block)
    (marks / ("done-" + payload["task_id"])).touch()

scheduler = EmbeddedScheduler(url, concurrency=1, lease_seconds=lease)
scheduler.run(target, stop)
scheduler.close()
"""

# Creates one schedule due 0.2 s after its own now, from another process.
CREATE_SCRIPT = """
import sys
from datetime import UTC, datetime, timedelta
from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler

scheduler = EmbeddedScheduler(sys.argv[1])
due = datetime.now(UTC) + timedelta(seconds=0.2)
payload = {"task_id": "remote", "due": due.isoformat()}
scheduler.create("sq-remote", "g", due.replace(tzinfo=None), "UTC", payload, "tok")
scheduler.close()
"""


def now() -> datetime:
    return datetime.now(UTC)


def wall(at: datetime) -> datetime:
    """``at`` as naive wall time in UTC (the zone these tests schedule in)."""
    return at.astimezone(UTC).replace(tzinfo=None)


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


class Recorder:
    """A target recording (payload, when) per call; optionally blocking or failing."""

    def __init__(self, *, hold: float = 0.0, fail: bool = False) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[dict[str, str], datetime]] = []
        self.hold = hold
        self.fail = fail
        self.running = 0
        self.max_running = 0
        self.fired = threading.Event()

    def __call__(self, payload: Mapping[str, str]) -> None:
        with self.lock:
            self.calls.append((dict(payload), now()))
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        self.fired.set()
        try:
            if self.hold:
                time.sleep(self.hold)
            if self.fail:
                raise RuntimeError(f"refused {payload['task_id']}")
        finally:
            with self.lock:
                self.running -= 1

    @property
    def names(self) -> list[str]:
        with self.lock:
            return [payload["task_id"] for payload, _ in self.calls]

    def first_call(self, task_id: str) -> datetime:
        with self.lock:
            return next(at for payload, at in self.calls if payload["task_id"] == task_id)


@contextmanager
def dispatching(scheduler: EmbeddedScheduler, target: Target) -> Iterator[threading.Thread]:
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            scheduler.run(target, stop)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="test-dispatcher")
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(timeout=15)
        assert not thread.is_alive(), "the dispatcher did not stop"
        assert errors == []


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'scheduler.db'}"


@pytest.fixture
def scheduler(url: str) -> Iterator[EmbeddedScheduler]:
    with EmbeddedScheduler(url, alarm=RecordingAlarm()) as opened:
        yield opened


def create_due(
    scheduler: EmbeddedScheduler, name: str, due: datetime, *, max_retries: int = 2
) -> None:
    scheduler.create(name, "g", wall(due), "UTC", {"task_id": name}, "tok", max_retries)


def test_a_schedule_fires_within_half_a_second_of_its_time(scheduler: EmbeddedScheduler) -> None:
    target = Recorder()
    with dispatching(scheduler, target):
        due = now() + timedelta(seconds=0.3)
        create_due(scheduler, "sq-soon", due)
        assert target.fired.wait(5)
    lateness = (target.first_call("sq-soon") - due).total_seconds()
    assert 0 <= lateness < 0.5
    assert scheduler.get("sq-soon") is None


def test_a_sleeping_dispatcher_is_woken_by_an_earlier_schedule(
    scheduler: EmbeddedScheduler,
) -> None:
    create_due(scheduler, "sq-later", now() + timedelta(seconds=60))
    target = Recorder()
    with dispatching(scheduler, target):
        time.sleep(0.5)  # let it settle into its 30 s sleep
        due = now() + timedelta(seconds=0.2)
        create_due(scheduler, "sq-early", due)
        assert target.fired.wait(5)
        assert target.names == ["sq-early"]
    assert (target.first_call("sq-early") - due).total_seconds() < 0.5
    assert scheduler.get("sq-later") is not None


def test_a_create_from_another_process_wakes_the_dispatcher(
    scheduler: EmbeddedScheduler, url: str
) -> None:
    create_due(scheduler, "sq-later", now() + timedelta(seconds=60))
    target = Recorder()
    with dispatching(scheduler, target):
        time.sleep(0.5)
        subprocess.run([sys.executable, "-c", CREATE_SCRIPT, url], check=True, timeout=30)
        assert target.fired.wait(5), "not woken by the other process's create"
        [(payload, fired_at)] = target.calls
    due = datetime.fromisoformat(payload["due"])
    assert payload["task_id"] == "remote"
    assert 0 <= (fired_at - due).total_seconds() < 0.5


def test_a_batch_submitted_while_the_dispatcher_sleeps_wakes_it(
    scheduler: EmbeddedScheduler,
) -> None:
    create_due(scheduler, "sq-later", now() + timedelta(seconds=60))
    target = Recorder()
    with dispatching(scheduler, target):
        time.sleep(0.5)
        due = now() + timedelta(seconds=0.2)
        items = [(f"sq-b{i}", "g", due, "UTC", {"task_id": f"b{i}"}, f"t{i}", 2) for i in range(3)]
        assert scheduler.submit_many(items)() == [None] * 3
        wait_for(lambda: len(target.calls) == 3, 5, "the submitted batch to fire")
    assert sorted(target.names) == ["b0", "b1", "b2"]
    assert all(0 <= (target.first_call(f"b{i}") - due).total_seconds() < 0.5 for i in range(3))


def test_overdue_schedules_fire_in_due_order_after_downtime(url: str) -> None:
    base = now() - timedelta(hours=2)
    order = [(i * 7919) % 200 for i in range(200)]  # a fixed permutation of 0..199
    with EmbeddedScheduler(url, concurrency=1) as scheduler:
        for i in order:
            create_due(scheduler, f"sq-{i:03d}", base + timedelta(seconds=i))
        target = Recorder()
        with dispatching(scheduler, target):
            wait_for(lambda: len(target.calls) == 200, 30, "200 invocations")
        assert target.names == [f"sq-{i:03d}" for i in range(200)]
        assert scheduler.list("g") == []


def test_no_more_targets_run_at_once_than_the_concurrency(url: str) -> None:
    with EmbeddedScheduler(url, concurrency=3) as scheduler:
        for i in range(12):
            create_due(scheduler, f"sq-{i:02d}", now())
        target = Recorder(hold=0.2)
        started = time.monotonic()
        with dispatching(scheduler, target):
            wait_for(lambda: len(target.calls) == 12, 20, "12 invocations")
            wait_for(lambda: scheduler.list("g") == [], 5, "the schedules to be deleted")
            elapsed = time.monotonic() - started
    assert sorted(target.names) == [f"sq-{i:02d}" for i in range(12)]
    assert target.max_running == 3
    # 4 rounds of 0.2 s: a slot is reused as soon as its target ends, not at the next renewal.
    assert elapsed < 5.0


def test_two_dispatchers_on_one_file_fire_each_schedule_once(url: str) -> None:
    one = EmbeddedScheduler(url, concurrency=4)
    two = EmbeddedScheduler(url, concurrency=4)
    try:
        for i in range(100):
            create_due(one, f"sq-{i:03d}", now())
        target = Recorder()
        with dispatching(one, target), dispatching(two, target):
            wait_for(lambda: one.list("g") == [], 20, "every schedule to fire")
        assert sorted(target.names) == [f"sq-{i:03d}" for i in range(100)]
    finally:
        one.close()
        two.close()


def start_dispatcher(url: str, marks: Path, *, lease: float, block: float) -> subprocess.Popen[str]:
    marks.mkdir(exist_ok=True)
    process = subprocess.Popen(
        [sys.executable, "-c", DISPATCHER_SCRIPT, url, str(marks), str(lease), str(block)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return process


def test_a_schedule_whose_process_was_killed_fires_again_after_its_lease(
    scheduler: EmbeddedScheduler, url: str, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    create_due(scheduler, "sq-crash", now())
    process = start_dispatcher(url, marks, lease=1.0, block=60)
    try:
        wait_for((marks / "started-sq-crash").exists, 20, "the subprocess to start the target")
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        killed_at = now()
    finally:
        process.kill()
        process.communicate()
    assert list(scheduler.leases()) == ["sq-crash"]  # held by a dead process

    target = Recorder()
    with dispatching(scheduler, target):
        assert target.fired.wait(10)
    assert target.names == ["sq-crash"]
    # Not before the lease (1 s, renewed every 1/3 s) ran out; soon after it did.
    assert 0.3 <= (target.first_call("sq-crash") - killed_at).total_seconds() < 3.0
    assert scheduler.get("sq-crash") is None
    assert scheduler.leases() == {}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_signal_lets_the_running_target_finish_and_releases_everything(
    scheduler: EmbeddedScheduler, url: str, tmp_path: Path, signum: int
) -> None:
    marks = tmp_path / "marks"
    create_due(scheduler, "sq-1", now() - timedelta(seconds=2))
    create_due(scheduler, "sq-2", now() - timedelta(seconds=1))
    process = start_dispatcher(url, marks, lease=30.0, block=1.0)
    try:
        wait_for((marks / "started-sq-1").exists, 20, "the subprocess to start the target")
        process.send_signal(signum)
        output, _ = process.communicate(timeout=20)
    finally:
        process.kill()
    assert process.returncode == 0, output
    assert (marks / "done-sq-1").exists()  # the in-flight invocation completed
    assert not (marks / "started-sq-2").exists()  # nothing new was taken after the signal
    assert scheduler.get("sq-1") is None
    untouched = scheduler.get("sq-2")
    assert untouched is not None
    assert untouched.attempts == 0
    assert scheduler.leases() == {}


class _Hook(BaseHTTPRequestHandler):
    received: list[dict[str, object]]
    event: threading.Event

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()
        type(self).event.set()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[tuple[str, type[_Hook]]]:
    handler = type("Hook", (_Hook,), {"received": [], "event": threading.Event()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hooks/sendqueue", handler
    finally:
        server.shutdown()
        server.server_close()


def test_a_failing_target_ends_in_the_dead_letters_and_posts_the_alarm(
    url: str, webhook: tuple[str, type[_Hook]], caplog: pytest.LogCaptureFixture
) -> None:
    hook_url, hook = webhook
    alarm = LoggingAlarm(hook_url, timeout=5)
    with EmbeddedScheduler(url, alarm=alarm, retry_backoff=0.05, max_backoff=0.2) as scheduler:
        create_due(scheduler, "sq-doomed", now(), max_retries=2)
        target = Recorder(fail=True)
        with dispatching(scheduler, target):
            assert hook.event.wait(10), "no webhook POST arrived"
        [letter] = scheduler.dead_letters()
        assert target.names == ["sq-doomed"] * 3
        assert scheduler.get("sq-doomed") is None
    [document] = hook.received
    assert document == {
        "event": "dead_letter",
        "id": letter.id,
        "schedule": "sq-doomed",
        "group": "g",
        "payload": {"task_id": "sq-doomed"},
        "error": "RuntimeError: refused sq-doomed",
        "attempts": 3,
        "failed_at": letter.failed_at.isoformat(),
    }
    assert any(
        r.levelname == "ERROR" and r.name == "sendqueue.alarm" and "sq-doomed" in r.getMessage()
        for r in caplog.records
    )


def test_schedules_survive_reopening_the_file(url: str) -> None:
    with EmbeddedScheduler(url) as first:
        created = first.create("sq-a", "g", datetime(2030, 1, 1, 9), "Europe/Berlin", {}, "t")
    with EmbeddedScheduler(url) as second:
        assert second.get("sq-a") == created


def test_a_file_of_another_schema_version_is_refused(tmp_path: Path, url: str) -> None:
    EmbeddedScheduler(url).close()
    with sqlite3.connect(tmp_path / "scheduler.db") as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.close()
    with pytest.raises(SchedulerError, match="schema version 99"):
        EmbeddedScheduler(url)


def test_an_unusable_file_raises_scheduler_error(tmp_path: Path) -> None:
    with pytest.raises(SchedulerError):
        EmbeddedScheduler(f"sqlite:///{tmp_path / 'missing-dir' / 'scheduler.db'}")
    (tmp_path / "not-a-db").write_bytes(os.urandom(4096))
    with pytest.raises(SchedulerError):
        EmbeddedScheduler(f"sqlite:///{tmp_path / 'not-a-db'}")


class ProcessDied(BaseException):
    """Stands in for the process dying in the middle of an invocation."""


def test_fire_due_releases_what_it_claimed_but_did_not_start(url: str) -> None:
    clock = FakeClock(datetime(2026, 12, 1, 8, 0, tzinfo=UTC))
    with EmbeddedScheduler(url, clock=clock, alarm=RecordingAlarm()) as scheduler:
        for name in ("sq-1", "sq-2", "sq-3"):
            create_due(scheduler, name, clock.now())

        def die(payload: Mapping[str, str]) -> None:
            raise ProcessDied

        with pytest.raises(ProcessDied):
            scheduler.fire_due(die)
        assert list(scheduler.leases()) == ["sq-1"]  # started: its lease must expire first
        target = Recorder()
        assert scheduler.fire_due(target) == 2
        assert target.names == ["sq-2", "sq-3"]


def test_an_expired_lease_counts_as_a_failed_attempt(url: str) -> None:
    clock = FakeClock(datetime(2026, 12, 1, 8, 0, tzinfo=UTC))
    alarm = RecordingAlarm()
    with EmbeddedScheduler(url, clock=clock, alarm=alarm, lease_seconds=60) as scheduler:
        create_due(scheduler, "sq-poison", clock.now(), max_retries=1)

        def die(payload: Mapping[str, str]) -> None:
            raise ProcessDied

        target = Recorder()
        with pytest.raises(ProcessDied):
            scheduler.fire_due(die)
        clock.advance(59)
        assert scheduler.fire_due(target) == 0  # still leased by the "dead" invocation
        clock.advance(2)
        with pytest.raises(ProcessDied):
            scheduler.fire_due(die)  # the second attempt; it dies too
        leased = scheduler.get("sq-poison")
        assert leased is not None
        assert leased.attempts == 1
        clock.advance(61)
        assert scheduler.fire_due(target) == 0  # attempts exhausted: dead letter, not a 3rd run
        assert target.calls == []
        [letter] = scheduler.dead_letters()
        assert letter.attempts == 2
        assert "LeaseExpired" in letter.error
        assert alarm.letters == [letter]
        assert scheduler.get("sq-poison") is None


def test_a_shutdown_past_its_timeout_releases_the_queued_schedules_that_never_started(
    url: str,
) -> None:
    """Only the invocation still running keeps its lease: the schedule queued behind it was
    claimed but never started, so it is free again at once, its attempt not counted."""
    release = threading.Event()

    def stuck(payload: Mapping[str, str]) -> None:
        release.wait(10)

    with EmbeddedScheduler(url, concurrency=1, shutdown_timeout=0.2) as scheduler:
        create_due(scheduler, "sq-1", now() - timedelta(seconds=2), max_retries=0)
        create_due(scheduler, "sq-2", now() - timedelta(seconds=1), max_retries=0)
        try:
            with dispatching(scheduler, stuck):
                wait_for(lambda: len(scheduler.leases()) == 2, 10, "sq-1 running, sq-2 queued")
            assert list(scheduler.leases()) == ["sq-1"]
        finally:
            release.set()
        queued = scheduler.get("sq-2")
        assert queued is not None
        assert queued.attempts == 0
