"""``dead_letter`` events that a crash cannot lose, with real processes: the execution layer's
dead letters are the outbox, and a fresh worker's delivery loop relays a letter whose own
process died before relaying it, into one change-log entry, delivered once to a receiver
process that verifies each signature.

- embedded: a ``sendqueue worker`` whose sends fail (the store "down" for claims) is SIGKILLed
  right after its letter is written, before the alarm relays it; two fresh workers deliver
  exactly one ``dead_letter`` event;
- procrastinate on PostgreSQL: a letter written by a scheduler with no relay (a plain alarm)
  reaches the receiver through a ``sendqueue worker`` fleet;
- a redrive (``sendqueue dlq redrive``, one and ``--all``) of letters no relay met yet relays
  each before it removes it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler
from sendqueue.adapters.procrastinate.scheduler import ProcrastinateScheduler
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.errors import StoreUnavailable
from sendqueue.domain.webhooks import DEAD_LETTER, event_id
from sendqueue.testing.alarm import RecordingAlarm
from tests.integration.test_procrastinate import _env as _pg_env
from tests.integration.test_procrastinate import _fleet, _settings
from tests.integration.test_webhooks_e2e import _campaign
from tests.support import worker_proc
from tests.support.real import real_app, wait_until
from tests.support.smtp import SmtpSink
from tests.support.webhook_e2e import ROOT, Receiver, worker_env

pytestmark = pytest.mark.slow


def _dead_letter_entries(app: Container) -> list[tuple[str, str | None]]:
    """(event id, task id) of every dead_letter entry in the change log."""
    entries = app.store.changes_after(0, limit=10_000)
    return [(event_id(e.id), e.task_id) for e in entries if e.to_state == DEAD_LETTER]


def _delivered(receiver: Receiver) -> list[str]:
    """The dead_letter events the receiver verified, once each, in the order they came."""
    seen: dict[str, None] = {}
    for record in receiver.records():
        if record.get("ok") and record["type"] == "dead_letter":
            seen.setdefault(record["id"])
    return list(seen)


def _receiver(app: Container, tmp_path: Path) -> Receiver:
    made = app.webhooks.add("http://127.0.0.1:1/hook")  # the port is set once it listens
    receiver = Receiver(tmp_path, made.secret)
    receiver.start()
    app.webhooks.update(made.endpoint.id, url=receiver.url)
    return receiver


def _kill_after_the_dead_letter(env: dict[str, str]) -> str:
    """A worker held right after its first dead letter is written, SIGKILLed there; the
    letter's id."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.worker_proc", "--hold-at", "dead-letter"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "READY"
    line = proc.stdout.readline().split()
    assert line[:2] == ["HOLD", "dead-letter"], line
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    return line[2]


def test_a_worker_killed_between_its_dead_letter_and_the_relay_loses_no_event(
    tmp_path: Path, smtp_sink: SmtpSink
) -> None:
    app = real_app(tmp_path, smtp_sink.url())
    receiver = _receiver(app, tmp_path)
    cid = _campaign(app, 1, 1.0)
    [task] = app.store.list_tasks(cid)
    held = worker_env(tmp_path, smtp_sink.url())
    held.update(
        SENDQUEUE_SCHEDULER_RETRY_BACKOFF="0.1",
        SENDQUEUE_DEAD_LETTER_RELAY_INTERVAL="3600",  # only the alarm would relay it
    )
    letter = _kill_after_the_dead_letter(held)
    # The letter is in the scheduler's file, written with the failure; its event is nowhere.
    assert [(d.id, d.payload["task_id"]) for d in app.scheduler.dead_letters()] == [
        (letter, task.id)
    ]
    assert _dead_letter_entries(app) == []

    fresh = worker_env(tmp_path, smtp_sink.url())
    fresh["SENDQUEUE_DEAD_LETTER_RELAY_INTERVAL"] = "0.2"
    workers = [
        worker_proc.start(fresh),
        worker_proc.start(fresh),
    ]  # both relay the same queue, every 0.2 s
    try:
        wait_until(lambda: bool(_delivered(receiver)), 60, "the dead_letter event")
        time.sleep(2.0)  # many more relay runs of both workers
    finally:
        for worker in workers:
            worker_proc.stop(worker)
        receiver.kill()
    [(event, relayed_task)] = _dead_letter_entries(app)
    assert relayed_task == task.id
    assert _delivered(receiver) == [event]
    assert all(r.get("ok") for r in receiver.records())
    assert [d.id for d in app.scheduler.dead_letters()] == [letter]  # relaying keeps it
    app.close()


@pytest.mark.postgres
@pytest.mark.xdist_group("many-connections")
def test_procrastinate_workers_make_the_event_of_a_letter_no_alarm_relayed(
    tmp_path: Path, postgres_url: str, smtp_sink: SmtpSink
) -> None:
    # This process's layer raises a recording alarm only: the letter it writes has no event,
    # as when its worker is killed before relaying it.
    recorded = RecordingAlarm()
    scheduler = ProcrastinateScheduler(
        postgres_url, alarm=recorded, retry_backoff=0.1, poll_interval=0.2, reconcile_interval=None
    )
    app = bootstrap(_settings(postgres_url, smtp_sink.url()), scheduler=scheduler)
    receiver = _receiver(app, tmp_path)
    cid = _campaign(app, 1, 1.0)
    [task] = app.store.list_tasks(cid)

    def store_down(_payload: Any) -> None:
        raise StoreUnavailable("the task store is down (played by the test)")

    stop = threading.Event()
    firing = threading.Thread(target=scheduler.run, args=(store_down, stop), daemon=True)
    firing.start()
    try:
        wait_until(lambda: bool(recorded.letters), 60, "the dead letter")
    finally:
        stop.set()
        firing.join(30)
    [letter] = scheduler.dead_letters()
    assert letter.payload["task_id"] == task.id and _dead_letter_entries(app) == []

    env = _pg_env(
        postgres_url,
        smtp_sink.url(),
        SENDQUEUE_WEBHOOK_ALLOW_HOSTS="127.0.0.1",
        SENDQUEUE_WEBHOOK_POLL_INTERVAL="0.1",
        SENDQUEUE_DEAD_LETTER_RELAY_INTERVAL="0.2",
    )
    try:
        with _fleet(tmp_path, postgres_url, [env, env]):
            wait_until(lambda: bool(_delivered(receiver)), 60, "the dead_letter event")
            time.sleep(2.0)  # many more relay runs of both workers
    finally:
        receiver.kill()
    [(event, relayed_task)] = _dead_letter_entries(app)
    assert relayed_task == task.id
    assert _delivered(receiver) == [event]
    app.close()


def test_a_redrive_from_the_cli_relays_the_letters_no_relay_met(
    tmp_path: Path, smtp_sink: SmtpSink
) -> None:
    app = real_app(tmp_path, smtp_sink.url())
    cid = _campaign(app, 2, 1.0)
    tasks = {t.id for t in app.store.list_tasks(cid)}
    # Another handle on the scheduler's file whose alarm only records: its letters are written
    # with no event, as by a worker killed before relaying them.
    layer = EmbeddedScheduler(app.settings.scheduler_url, alarm=RecordingAlarm(), retry_backoff=0.0)

    def store_down(_payload: Any) -> None:
        raise StoreUnavailable("the task store is down (played by the test)")

    wait_until(
        lambda: layer.fire_due(store_down) >= 0 and len(layer.dead_letters()) == 2,
        30,
        "two dead letters",
    )
    first, second = layer.dead_letters()
    layer.close()
    assert _dead_letter_entries(app) == []
    env = worker_env(tmp_path, smtp_sink.url())
    for args in (["dlq", "redrive", first.id], ["dlq", "redrive", "--all"]):
        done = subprocess.run(
            [sys.executable, "-m", "sendqueue.cli", *args],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, done.stderr
    assert app.scheduler.dead_letters() == []
    relayed = [task for _, task in _dead_letter_entries(app)]
    assert relayed == [first.payload["task_id"], second.payload["task_id"]]
    assert set(relayed) == tasks
    app.close()
