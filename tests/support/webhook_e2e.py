"""What the webhook end-to-end tests share: :class:`Receiver`, the handle on a receiver process
(tests/support/webhook_receiver.py); :func:`worker_env`, the environment of a ``sendqueue
worker`` process on a SQLite store with quick webhook retries and the receiver's 127.0.0.1
allowed; :func:`expected_events`, the ids of the events a store made, in the order made; and
:func:`first_arrivals`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sendqueue.bootstrap import Container
from sendqueue.domain.webhooks import event_of

__all__ = ["Receiver", "expected_events", "first_arrivals", "worker_env"]

ROOT = Path(__file__).resolve().parents[2]


class Receiver:
    """The receiver process, restartable on its port."""

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
        """Every request logged so far, in the order received."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def ids(self) -> list[str]:
        """The ids of the verified deliveries, in the order received (repeats included)."""
        return [r["id"] for r in self.records() if r.get("ok")]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"


def worker_env(tmp_path: Path, mailer: str, **extra: str) -> dict[str, str]:
    """The environment of a worker process on ``tmp_path``'s store and scheduler files that
    sends through ``mailer``: no SENDQUEUE_* of the caller's, webhook retries from 0.5 s
    doubling to 4 s, a delivery pass every 0.1 s, no periodic reconcile; ``extra`` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDQUEUE_")}
    env.update(
        SENDQUEUE_DATABASE_URL=f"sqlite:///{tmp_path / 'store.db'}",
        SENDQUEUE_SCHEDULER_URL=f"sqlite:///{tmp_path / 'scheduler.db'}",
        SENDQUEUE_MAILER=mailer,
        SENDQUEUE_WEBHOOK_ALLOW_HOSTS="127.0.0.1",
        SENDQUEUE_WEBHOOK_RETRY_BASE="0.5",
        SENDQUEUE_WEBHOOK_RETRY_CAP="4",
        SENDQUEUE_WEBHOOK_POLL_INTERVAL="0.1",
        SENDQUEUE_WEBHOOK_TIMEOUT="2",
        SENDQUEUE_RECONCILE_INTERVAL="3600",
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    )
    env.update(extra)
    return env


def expected_events(app: Container, after: int) -> list[str]:
    """The ids of every event made after change ``after``, in the order made."""
    entries = app.store.changes_after(after, limit=10_000)
    return [event.id for e in entries if (event := event_of(e)) is not None]


def first_arrivals(ids: list[str]) -> list[str]:
    """``ids`` without repeats, each where it first arrived."""
    seen: dict[str, None] = {}
    for i in ids:
        seen.setdefault(i)
    return list(seen)
