"""A real ``sendqueue worker`` process with a kill point and a store fault, for crash tests.

Run as ``python -m tests.support.worker_proc [--hold-at claim|accepted|made|dead-letter]
[--nth N] [--unreadable TASK_ID ...]``; settings come from the SENDQUEUE_* environment like the
real worker. At the N-th claim (Pending -> Running written by ``claim_for_send``), the N-th SMTP
accept (before Finished is written, so before a sequence's next step is marked) or the N-th
next step of a sequence stored (after the step sent is recorded Finished and marked, before
the next one's schedule and before the mark is cleared), it prints ``HOLD <point> <task id>``
and blocks, so the test can SIGKILL it exactly there.

``dead-letter``: every claim fails as if the task store were down, so each send is retried and
then dead-lettered; at the N-th dead letter, written to the execution layer's storage, it
prints ``HOLD dead-letter <letter id>`` and blocks before the alarm relays the letter into the
change log. The relay's first run happens before ``READY`` (no send has failed yet); run it
with a long SENDQUEUE_DEAD_LETTER_RELAY_INTERVAL so the delivery loop does not run it again.

A send of an ``--unreadable`` task finds the store unavailable when it reads the task, every
time, as in an outage only that invocation meets: the execution layer retries it and then
dead-letters it.

:func:`start` runs it (after ``READY``), :func:`stop` ends it with SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, cast

from sendqueue.adapters.mail.factory import mailer_from_url
from sendqueue.adapters.sql import open_store
from sendqueue.bootstrap import bootstrap
from sendqueue.domain.alarms import AutoPause
from sendqueue.domain.errors import StoreUnavailable
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import DeadLetter, Task
from sendqueue.domain.suppression import Suppression
from sendqueue.ports import Alarm, Mailer, OutgoingMessage, SuppressionList, TaskStore
from sendqueue.runtime import run_worker
from sendqueue.settings import Settings

__all__ = ["start", "stop"]

ROOT = Path(__file__).resolve().parents[2]


class _Hold:
    def __init__(self, point: str | None, nth: int) -> None:
        self.point = point
        self.remaining = nth
        self.lock = threading.Lock()

    def reached(self, point: str, what: str) -> None:
        if point != self.point:
            return
        with self.lock:
            self.remaining -= 1
            hit = self.remaining == 0
        if hit:
            sys.stdout.write(f"HOLD {point} {what}\n")
            sys.stdout.flush()
            threading.Event().wait()  # until the test kills us


class HoldingStore:
    def __init__(self, inner: TaskStore, hold: _Hold, unreadable: Collection[str] = ()) -> None:
        self.inner = inner
        self.hold = hold
        self.unreadable = frozenset(unreadable)

    def task_and_suppression(self, task_id: str) -> tuple[Task | None, Suppression | None]:
        """The send's first read (``SuppressionList.task_and_suppression``)."""
        if task_id in self.unreadable:
            raise StoreUnavailable(f"reading task {task_id}: the store did not answer")
        return cast(SuppressionList, self.inner).task_and_suppression(task_id)

    def claim_for_send(self, task_id: str, **kw: Any) -> Any:
        """The send's claim (``TaskStore.claim_for_send``, its first store call)."""
        if task_id in self.unreadable:
            raise StoreUnavailable(f"reading task {task_id}: the store did not answer")
        if self.hold.point == "dead-letter":
            raise StoreUnavailable("the task store is down (played by the test)")
        claim = self.inner.claim_for_send(task_id, **kw)
        if claim.claimed:
            self.hold.reached("claim", task_id)
        return claim

    def transition(self, task_id: str, expected: TaskState, new: TaskState, **kw: Any) -> Any:
        if self.hold.point == "dead-letter" and new is TaskState.RUNNING:
            raise StoreUnavailable("the task store is down (played by the test)")
        result = self.inner.transition(task_id, expected, new, **kw)
        if result is not None and new is TaskState.RUNNING:
            self.hold.reached("claim", task_id)
        return result

    def insert_tasks(self, tasks: Sequence[Task], **kw: Any) -> int:
        """Where a sequence's next step is stored (before its schedule, and before the mark
        of the step sent is cleared)."""
        inserted = self.inner.insert_tasks(tasks, **kw)
        later = [t.id for t in tasks if t.step > 1]
        if inserted and later:
            self.hold.reached("made", later[0])
        return inserted

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class HoldingMailer:
    def __init__(self, inner: Mailer, hold: _Hold) -> None:
        self.inner = inner
        self.hold = hold

    def send(self, message: OutgoingMessage) -> str:
        accepted = self.inner.send(message)
        self.hold.reached("accepted", message.headers.get("X-Sendqueue-Task", "?"))
        return accepted

    def close(self) -> None:
        self.inner.close()


class HoldingAlarm:
    """The scheduler's alarm (the relay, then the real alarm), held before it starts."""

    def __init__(self, inner: Alarm, hold: _Hold) -> None:
        self.inner = inner
        self.hold = hold

    def raise_alarm(self, letter: DeadLetter) -> None:
        self.hold.reached("dead-letter", letter.id)
        self.inner.raise_alarm(letter)

    def auto_paused(self, pause: AutoPause) -> None:
        self.inner.auto_paused(pause)


def main() -> None:
    parser = argparse.ArgumentParser()
    points = ["claim", "accepted", "made", "dead-letter"]
    parser.add_argument("--hold-at", choices=points, default=None)
    parser.add_argument("--nth", type=int, default=1)
    parser.add_argument("--unreadable", action="append", default=[], metavar="TASK_ID")
    args = parser.parse_args()
    settings = Settings()
    hold = _Hold(args.hold_at, args.nth)
    store = HoldingStore(open_store(settings.database_url), hold, args.unreadable)
    mailer = HoldingMailer(mailer_from_url(settings.mailer), hold)
    app = bootstrap(settings, store=store, mailer=mailer)
    if args.hold_at == "dead-letter":
        scheduler: Any = app.scheduler
        scheduler.alarm = HoldingAlarm(scheduler.alarm, hold)
        app.dead_letter_relay.run(force=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    run_worker(app, stop)
    app.close()
    sys.stdout.write("STOPPED\n")
    sys.stdout.flush()


def start(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """This module as a worker process with ``env`` and ``args``, once it printed READY."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.worker_proc", *args],
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


def stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, then wait for a clean exit (in-flight sends finish)."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "STOPPED" in out


if __name__ == "__main__":
    main()
