"""Real-parts wiring for integration tests: SQLite or PostgreSQL store, embedded scheduler,
SMTP mailer pointed at the test's aiosmtpd sink, a dispatcher thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.lifecycle import TaskState
from sendqueue.runtime import run_worker
from sendqueue.settings import Settings

__all__ = ["all_final", "real_app", "running_worker", "wait_until"]


def real_app(tmp_path: Path, mailer_url: str, **overrides: Any) -> Container:
    values: dict[str, Any] = {
        "_env_file": None,
        "database_url": f"sqlite:///{tmp_path / 'store.db'}",
        "scheduler_url": f"sqlite:///{tmp_path / 'scheduler.db'}",
        "mailer": mailer_url,
        "retry_backoff": 0.5,
        "scheduler_retry_backoff": 0.2,
        "scheduler_lease": 5,
        "worker_concurrency": 4,
    }
    values.update(overrides)
    return bootstrap(Settings(**values))


@contextmanager
def running_worker(app: Container, **kwargs: Any) -> Iterator[threading.Event]:
    """Run the dispatcher (and, unless told otherwise, no periodic reconciler) in a thread."""
    stop = threading.Event()
    kwargs.setdefault("reconcile_at_start", False)
    kwargs.setdefault("reconcile_interval", 3600)
    thread = threading.Thread(target=run_worker, args=(app, stop), kwargs=kwargs, daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(30)
        assert not thread.is_alive(), "the worker did not stop within 30 s"


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")


def all_final(app: Container, campaign_id: str) -> bool:
    counts = app.store.count_tasks(campaign_id)
    return counts[TaskState.PENDING] == 0 and counts[TaskState.RUNNING] == 0
