"""What the parts of benchmark 15 share: the store, the tasks whose changes make events, the
worker processes and the report of what arrived.

- :func:`open_app`: the embedded default on a SQLite file (the store every process of a
  scenario shares), webhooks allowed to 127.0.0.1.
- :func:`pending_tasks`: Pending tasks of one active campaign, written with ``insert_tasks``;
  cancelling one (:func:`cancel`, ``TaskStore.transition``) makes one ``email.cancelled``.
- :class:`Child`: a worker process speaking the ``ready`` / ``go`` / ``stop`` line protocol.
  ``python -m bench.webhook_setup deliver STORE`` is a worker with nothing to send
  (``run_worker``: its dispatcher idle, its webhook delivery loop running); the send benchmark
  is ``python -m bench.throughput sendqueue ... --handshake``.
- :func:`report`: every event the store made between two change ids, against the receiver's
  log: delivered, lost, repeated, badly signed, out of order, and the lag (first arrival minus
  the change's time).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

from bench.common import ROOT, cpu_seconds, percentile
from bench.webhook_receiver import arrivals
from bench.workers import wait_for_line

__all__ = [
    "Child",
    "cancel",
    "child_env",
    "delivery_log_rows",
    "open_app",
    "pending_tasks",
    "report",
    "wait_cursor",
]


def child_env(poll: float) -> dict[str, str]:
    """A worker child's environment: this checkout importable, webhooks allowed to 127.0.0.1,
    the delivery loop's poll interval ``poll`` (Settings reads ``SENDQUEUE_*``)."""
    return {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "SENDQUEUE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
        "SENDQUEUE_WEBHOOK_POLL_INTERVAL": str(poll),
    }


def open_app(store: Path, home: Path) -> Any:
    """A container on the SQLite file ``store`` (its scheduler and outbox in ``home``)."""
    from sendqueue.bootstrap import bootstrap
    from sendqueue.settings import Settings

    return bootstrap(
        Settings(
            _env_file=None,
            database_url=f"sqlite:///{store}",
            scheduler_url=f"sqlite:///{home / 'scheduler.db'}",
            mailer=f"maildir:{home / 'outbox'}",
            webhook_allow_hosts="127.0.0.1",
        )
    )


def pending_tasks(app: Any, count: int, name: str) -> list[str]:
    """``count`` Pending tasks of a new active campaign ``name`` (13 characters), due in a day
    (no schedule: nothing sends them); their ids in position order."""
    from sendqueue.domain.lifecycle import CampaignState
    from sendqueue.domain.models import Campaign, Task, task_id
    from sendqueue.domain.policy import SendingPolicy

    now = datetime.now(UTC)
    policy = SendingPolicy(timezone="UTC", per_day=10_000, start=now - timedelta(days=1))
    campaign = Campaign(
        id=name, name=name, policy=policy, from_addr="a@example.com", state=CampaignState.ACTIVE
    )
    app.store.create_campaign(campaign, [])
    ids = []
    for start in range(0, count, 1000):
        chunk = [
            Task(
                id=task_id(name, i), campaign_id=name, position=i, email=f"r{i}@example.com",
                name="", subject="s", text="t", html=None, send_at=now + timedelta(days=1),
                token=f"t{i}",
            )
            for i in range(start, min(start + 1000, count))
        ]  # fmt: skip
        app.store.insert_tasks(chunk, at=now)
        ids += [t.id for t in chunk]
    return ids


def cancel(app: Any, task: str) -> None:
    """One user's cancel of one Pending task: one transaction, one ``email.cancelled``."""
    from sendqueue.domain.lifecycle import TaskState

    app.store.transition(task, TaskState.PENDING, TaskState.CANCELLED, at=datetime.now(UTC))


def wait_cursor(app: Any, endpoint: str, end: int, timeout: float) -> bool:
    """Wait until the endpoint's cursor reached change ``end`` (every event up to it
    acknowledged by the receiver); False after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = app.store.get_endpoint(endpoint)
        if found is not None and found.cursor >= end:
            return True
        time.sleep(0.1)
    return False


def delivery_log_rows(store: Path, endpoint: str) -> dict[str, int]:
    """How many attempts the endpoint's delivery log holds, and how many of them failed."""
    import sqlite3

    with sqlite3.connect(store) as db:
        total, failed = db.execute(
            "SELECT count(*), count(error) FROM webhook_deliveries WHERE endpoint_id = ?",
            (endpoint,),
        ).fetchone()
    return {"attempts_logged": int(total), "attempts_failed": int(failed)}


def report(app: Any, after: int, until: int, log: Path) -> dict[str, Any]:
    """The events made by the changes in ``(after, until]`` against the receiver's log."""
    from sendqueue.domain.webhooks import event_of

    made: dict[str, tuple[int, float]] = {}
    kinds: dict[str, int] = {}
    cursor = after
    while cursor < until:
        page = app.store.changes_after(cursor, limit=10_000)
        if not page:
            break
        for entry in page:
            event = event_of(entry) if entry.id <= until else None
            if event is not None:
                made[event.id] = (entry.id, entry.at.timestamp())
                kinds[event.type.value] = kinds.get(event.type.value, 0) + 1
        cursor = page[-1].id
    seen, order = arrivals(log)
    lags = sorted(seen[k].at - at for k, (_, at) in made.items() if k in seen)
    firsts = [made[k][0] for k in order if k in made]
    return {
        "events": len(made),
        "by_type": kinds,
        "delivered": len(lags),
        "lost": len(made) - len(lags),
        "repeated": sum(seen[k].count - 1 for k in made if k in seen),
        "badly_signed": sum(1 for k in made if k in seen and not seen[k].signed),
        "in_order": all(a < b for a, b in itertools.pairwise(firsts)),
        "requests": sum(a.count for a in seen.values()),
        "last_arrival": max((a.at for a in seen.values()), default=float("nan")),
        "lag_p50_s": percentile(lags, 0.5) if lags else float("nan"),
        "lag_p99_s": percentile(lags, 0.99) if lags else float("nan"),
        "lag_max_s": lags[-1] if lags else float("nan"),
    }


class Child:
    """A worker process on the ``ready`` / ``go`` / ``stop`` protocol (``python -m ARGS``);
    its stdout lines are read by a thread, so the parent can poll for one."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self._err: IO[str] = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *args], cwd=ROOT, env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
        )  # fmt: skip
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip():
                self._lines.put(line.strip())
        self._lines.put(None)

    def line(self, timeout: float | None) -> str | None:
        """The next line, or None after ``timeout`` seconds (0: only one already read)."""
        try:
            got = self._lines.get(timeout=timeout) if timeout else self._lines.get_nowait()
        except queue.Empty:
            return None
        if got is None:
            raise RuntimeError(f"the worker child ended ({self.proc.wait()}): {self._stderr()}")
        return got

    def expect(self, expected: str, timeout: float) -> None:
        got = self.line(timeout)
        if got != expected:
            raise RuntimeError(f"the worker child said {got!r}, not {expected!r}: {self._stderr()}")

    def say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stop(self, timeout: float = 120) -> dict[str, Any]:
        """``stop``, then the child's last JSON line once it has ended."""
        try:
            self.say("stop")
            self.proc.wait(timeout)
            last = None
            while (got := self._lines.get(timeout=10)) is not None:
                last = got
            if self.proc.returncode != 0 or last is None:
                raise RuntimeError(f"the worker child failed: {self._stderr()}")
            result: dict[str, Any] = json.loads(last)
            return result
        finally:
            self.kill()

    def kill(self) -> None:
        """End the process (if it still runs) and close its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(10)
        for pipe in (self.proc.stdin, self.proc.stdout, self._err):
            if pipe is not None and not pipe.closed:
                with contextlib.suppress(OSError):
                    pipe.close()

    def _stderr(self) -> str:
        self._err.seek(0)
        return self._err.read()[-3000:]


def child_deliver(store: str, home: Path) -> dict[str, Any]:
    """A worker process with nothing to send: ``run_worker`` from ``go`` to ``stop`` (its
    reconciler kept out, as the send benchmark's is); its CPU seconds meanwhile."""
    from sendqueue.bootstrap import bootstrap
    from sendqueue.runtime import run_worker
    from sendqueue.settings import Settings

    app = bootstrap(
        Settings(
            _env_file=None,
            database_url=store,
            scheduler_url=f"sqlite:///{home / 'scheduler.db'}",
            mailer=f"maildir:{home / 'outbox'}",
        )
    )
    _ = app.store, app.scheduler, app.webhook_delivery
    stop = threading.Event()
    kwargs = {"reconcile_at_start": False, "reconcile_interval": 3600}
    worker = threading.Thread(target=run_worker, args=(app, stop), kwargs=kwargs, daemon=True)
    print("ready", flush=True)
    wait_for_line(sys.stdin, "go")
    cpu = cpu_seconds()
    worker.start()
    wait_for_line(sys.stdin, "stop")
    stop.set()
    worker.join(60)
    cpu = cpu_seconds() - cpu
    app.close()
    return {"cpu_s": cpu}


if __name__ == "__main__":
    if sys.argv[1:2] == ["deliver"]:
        with tempfile.TemporaryDirectory(prefix="sq-bench-deliver-") as tmp:
            print(json.dumps(child_deliver(sys.argv[2], Path(tmp))), flush=True)
