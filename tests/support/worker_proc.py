"""A real ``sendqueue worker`` process with a kill point, for crash tests.

Run as ``python -m tests.support.worker_proc [--hold-at claim|accepted] [--nth N]``; settings
come from the SENDQUEUE_* environment like the real worker. At the N-th claim (Pending ->
Running written) or the N-th SMTP accept (before Finished is written), it prints
``HOLD <point> <task id>`` and blocks, so the test can SIGKILL it exactly there.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from sendqueue.adapters.mail.factory import mailer_from_url
from sendqueue.adapters.sql import open_store
from sendqueue.bootstrap import bootstrap
from sendqueue.domain.lifecycle import TaskState
from sendqueue.ports import Mailer, OutgoingMessage, TaskStore
from sendqueue.runtime import run_worker
from sendqueue.settings import Settings


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
    def __init__(self, inner: TaskStore, hold: _Hold) -> None:
        self.inner = inner
        self.hold = hold

    def transition(self, task_id: str, expected: TaskState, new: TaskState, **kw: Any) -> Any:
        result = self.inner.transition(task_id, expected, new, **kw)
        if result is not None and new is TaskState.RUNNING:
            self.hold.reached("claim", task_id)
        return result

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hold-at", choices=["claim", "accepted"], default=None)
    parser.add_argument("--nth", type=int, default=1)
    args = parser.parse_args()
    settings = Settings()
    hold = _Hold(args.hold_at, args.nth)
    store = HoldingStore(open_store(settings.database_url), hold)
    mailer = HoldingMailer(mailer_from_url(settings.mailer), hold)
    app = bootstrap(settings, store=store, mailer=mailer)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    run_worker(app, stop)
    app.close()
    sys.stdout.write("STOPPED\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
