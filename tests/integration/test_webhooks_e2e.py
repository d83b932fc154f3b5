"""Webhooks end to end, with real processes: a receiver process on 127.0.0.1 (allowed through
SENDQUEUE_WEBHOOK_ALLOW_HOSTS) that verifies every signature with the ``standardwebhooks``
library and records the ids, and ``sendqueue worker`` processes sending a campaign to aiosmtpd.

- A campaign with a permanent failure, a cancel and a reply makes its events; the receiver is
  killed for 2 minutes in the middle (retries every 0.5 s doubling to 4 s, so many retries
  happen while the sends go on, undelayed) and comes back: nothing is lost, the order is kept,
  a duplicate carries its event's id.
- A worker SIGKILLed while a delivery is in flight: after a restart the event still arrives,
  with the same id.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.webhooks import event_of
from sendqueue.ports import FeedbackStore
from sendqueue.services.demo import demo_csv, demo_policy
from sendqueue.services.importing import Templates
from tests.support.real import all_final, real_app, wait_until
from tests.support.smtp import SmtpSink

ROOT = Path(__file__).resolve().parents[2]
OUTAGE_SECONDS = 120.0

pytestmark = pytest.mark.slow


class Receiver:
    """The receiver process (tests/support/webhook_receiver.py), restartable on its port."""

    def __init__(self, tmp_path: Path, secret: str) -> None:
        self.log = tmp_path / "received.jsonl"
        self.secret = secret
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None

    def start(self, *, hang_first: bool = False) -> None:
        args = ["--port", str(self.port), "--secret", self.secret, "--log", str(self.log)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.webhook_receiver", *args]
            + (["--hang-first"] if hang_first else []),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        assert line[0] == "PORT", line
        self.port = int(line[1])

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def records(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def ids(self) -> list[str]:
        return [r["id"] for r in self.records() if r.get("ok")]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"


def _env(tmp_path: Path, sink: SmtpSink) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDQUEUE_")}
    env.update(
        SENDQUEUE_DATABASE_URL=f"sqlite:///{tmp_path / 'store.db'}",
        SENDQUEUE_SCHEDULER_URL=f"sqlite:///{tmp_path / 'scheduler.db'}",
        SENDQUEUE_MAILER=sink.url(),
        SENDQUEUE_WEBHOOK_ALLOW_HOSTS="127.0.0.1",
        SENDQUEUE_WEBHOOK_RETRY_BASE="0.5",
        SENDQUEUE_WEBHOOK_RETRY_CAP="4",
        SENDQUEUE_WEBHOOK_POLL_INTERVAL="0.1",
        SENDQUEUE_WEBHOOK_TIMEOUT="2",
        SENDQUEUE_RECONCILE_INTERVAL="3600",
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    )
    return env


def _worker(env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.worker_proc"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "READY"
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "STOPPED" in out


def _campaign(app: Container, count: int, interval: float) -> str:
    cid = app.campaigns.create(
        name="hooks",
        recipients=demo_csv(count),
        policy=demo_policy(app.clock.now(), "UTC", count, interval),
        templates=Templates(subject="s {{ name }}", body="b"),
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    return cid


def _expected(app: Container, after: int) -> list[str]:
    """The ids of every event made after change ``after``, in the order made."""
    entries = app.store.changes_after(after, limit=10_000)
    return [event.id for e in entries if (event := event_of(e)) is not None]


def _first_arrivals(ids: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for i in ids:
        seen.setdefault(i)
    return list(seen)


@pytest.mark.timeout(480)
def test_a_receiver_outage_loses_nothing_and_keeps_the_order(
    tmp_path: Path, smtp_sink: SmtpSink
) -> None:
    app = real_app(tmp_path, smtp_sink.url())
    made = app.webhooks.add("http://127.0.0.1:1/hook")  # the port is set once it listens
    receiver = Receiver(tmp_path, made.secret)
    receiver.start()
    endpoint = made.endpoint.id
    app.webhooks.update(endpoint, url=receiver.url)
    start = app.webhooks.get(endpoint).cursor
    smtp_sink.reply_next("550 5.1.1 no such user")  # the first send fails for good
    cid = _campaign(app, 16, 2.5)
    cancelled = app.campaigns.cancel_task(f"{cid}-15")
    assert cancelled.state is TaskState.CANCELLED
    worker = _worker(_env(tmp_path, smtp_sink))
    try:
        wait_until(lambda: len(receiver.ids()) >= 3, 60, "the first events")
        receiver.kill()
        before = app.store.count_tasks(cid)
        time.sleep(OUTAGE_SECONDS)
        down = app.webhooks.get(endpoint)
        assert down.attempts >= 4, down  # several retries while it was down
        after = app.store.count_tasks(cid)
        # the sends went on while the endpoint failed (2.5 s apart: dozens in 2 minutes)
        assert after.get(TaskState.FINISHED, 0) >= before.get(TaskState.FINISHED, 0) + 10
        receiver.start()
        wait_until(lambda: all_final(app, cid), 120, "every task final")
        sent = app.store.list_tasks(cid, state=TaskState.FINISHED, limit=1)[0]
        feedback = cast(FeedbackStore, app.store)
        assert feedback.set_outcome(sent.id, TaskOutcome.REPLIED, detail="re", at=app.clock.now())
        expected = _expected(app, start)
        wait_until(lambda: set(expected) <= set(receiver.ids()), 120, "every event")
    finally:
        _stop(worker)
        receiver.kill()
    records = receiver.records()
    assert all(r.get("ok") for r in records), [r for r in records if not r.get("ok")]
    ids = receiver.ids()
    assert _first_arrivals(ids) == expected  # nothing lost, nothing extra, in order
    types = {r["type"] for r in records}
    assert {
        "email.sent",
        "email.failed",
        "email.cancelled",
        "email.replied",
        "campaign.completed",
    } <= types
    failures = [d for d in app.webhooks.deliveries(endpoint, limit=1000).deliveries if not d.ok]
    assert failures and all(d.event_id in expected for d in failures)


def test_a_worker_killed_mid_delivery_delivers_the_event_after_its_restart(
    tmp_path: Path, smtp_sink: SmtpSink
) -> None:
    app = real_app(tmp_path, smtp_sink.url())
    made = app.webhooks.add("http://127.0.0.1:1/hook")
    receiver = Receiver(tmp_path, made.secret)
    receiver.start(hang_first=True)
    app.webhooks.update(made.endpoint.id, url=receiver.url)
    start = app.webhooks.get(made.endpoint.id).cursor
    env = _env(tmp_path, smtp_sink)
    cid = _campaign(app, 3, 1.0)
    worker = _worker(env)

    def hung() -> str | None:
        return next((r["hung"] for r in receiver.records() if "hung" in r), None)

    wait_until(lambda: hung() is not None, 60, "a delivery in flight")
    worker.kill()  # SIGKILL, while the receiver holds the request
    worker.wait(10)
    assert worker.returncode == -signal.SIGKILL
    if worker.stdout is not None:
        worker.stdout.close()
    worker = _worker(env)
    try:
        wait_until(lambda: all_final(app, cid), 60, "every task final")
        wait_until(lambda: hung() in receiver.ids(), 60, "the killed delivery again")
        expected = _expected(app, start)
        wait_until(lambda: set(expected) <= set(receiver.ids()), 60, "every event")
    finally:
        _stop(worker)
        receiver.kill()
    assert _first_arrivals(receiver.ids()) == expected
    assert receiver.ids()[0] == hung()
