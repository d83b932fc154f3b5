"""Webhook delivery (benchmark 15): events per second from the change log to a local receiver,
and the end-to-end lag (the change's time to the receiver's arrival) under a steady load.

The store is the embedded default (SQLite, one file); the receiver is a child process
(``python -m bench.webhooks receive PORT_FILE LOG``) on 127.0.0.1, answering 204 and writing
each arrival's ``webhook-id`` and time. Events are ``email.cancelled`` changes (one task
cancelled, one change-log entry), made by a writer thread of this process.

- **drain**: a backlog of ``events`` made first (its making rate measured), then delivered by
  passes of :class:`~sendqueue.services.webhooks.WebhookDelivery` back to back: events/s, and
  the ratio to the making rate (target: >= 5x).
- **lag**: ``rate`` events/s made for ``seconds`` while the worker's delivery loop (its poll
  interval 0.05 s) runs in a thread: delivered/s and the lag's p50/p99 (target at 1,000/s:
  p99 <= 1 s).
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

__all__ = ["run"]


def _receive(port_file: str, log: str) -> None:
    out = open(log, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real receivers answer

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            with lock:
                out.write(f"{self.headers['webhook-id']} {time.time():.6f}\n")
            self.send_response(204)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    Path(port_file).write_text(str(server.server_address[1]))
    server.serve_forever()


def _receiver(home: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
    port_file, log = home / "port", home / "arrivals.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.webhooks", "receive", str(port_file), str(log)]
    )
    deadline = time.monotonic() + 10
    while not port_file.exists() or not port_file.read_text():
        if time.monotonic() > deadline:
            raise RuntimeError("the receiver did not start")
        time.sleep(0.02)
    return proc, int(port_file.read_text()), log


def _app(home: Path) -> Any:
    from sendqueue.bootstrap import bootstrap
    from sendqueue.settings import Settings

    return bootstrap(
        Settings(
            _env_file=None,
            database_url=f"sqlite:///{home / 'store.db'}",
            scheduler_url=f"sqlite:///{home / 'scheduler.db'}",
            mailer=f"maildir:{home / 'outbox'}",
            webhook_allow_hosts="127.0.0.1",
            webhook_poll_interval=0.05,
        )
    )


def _tasks(app: Any, count: int, name: str) -> list[str]:
    from sendqueue.domain.lifecycle import CampaignState
    from sendqueue.domain.models import Campaign, Task, task_id
    from sendqueue.domain.policy import SendingPolicy

    now = datetime.now(UTC)
    policy = SendingPolicy(timezone="UTC", per_day=10_000, start=now - timedelta(days=1))
    campaign = Campaign(
        id=name, name=name, policy=policy, from_addr="a@example.com", state=CampaignState.ACTIVE
    )
    app.store.create_campaign(campaign, [])
    tasks = [
        Task(
            id=task_id(name, i),
            campaign_id=name,
            position=i,
            email=f"r{i}@example.com",
            name="",
            subject="s",
            text="t",
            html=None,
            send_at=now + timedelta(days=1),
            token=f"t{i}",
        )
        for i in range(count)
    ]
    for start in range(0, count, 1000):
        app.store.insert_tasks(tasks[start : start + 1000], at=now)
    return [t.id for t in tasks]


def _cancel(app: Any, task: str) -> None:
    from sendqueue.domain.lifecycle import TaskState

    app.store.transition(task, TaskState.PENDING, TaskState.CANCELLED, at=datetime.now(UTC))


def _arrivals(log: Path) -> dict[str, float]:
    seen: dict[str, float] = {}
    for line in log.read_text().splitlines():
        ident, at = line.split()
        seen.setdefault(ident, float(at))
    return seen


def _drain(app: Any, events: int) -> dict[str, float]:
    tasks = _tasks(app, events, "cdrain0000000")
    t0 = time.perf_counter()
    for task in tasks:
        _cancel(app, task)
    making = events / (time.perf_counter() - t0)
    end = app.store.last_change_id()
    endpoint = app.webhooks.list()[0].id
    t0 = time.perf_counter()
    while app.webhooks.get(endpoint).cursor < end:
        app.webhook_delivery.run_pass()
    drain = events / (time.perf_counter() - t0)
    return {"events": events, "making_per_s": making, "drain_per_s": drain, "ratio": drain / making}


def _lag(app: Any, rate: float, seconds: float, log: Path) -> dict[str, float]:
    from sendqueue.domain.webhooks import event_id

    count = int(rate * seconds)
    tasks = _tasks(app, count, "clag000000000")
    stop = threading.Event()
    loop = threading.Thread(target=_loop, args=(app, stop), daemon=True)
    loop.start()
    made: dict[str, float] = {}
    t0 = time.perf_counter()
    for i, task in enumerate(tasks):
        wait = t0 + i / rate - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        _cancel(app, task)
        made[event_id(app.store.last_change_id())] = time.time()
    making = count / (time.perf_counter() - t0)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not set(made) <= set(_arrivals(log)):
        time.sleep(0.1)
    stop.set()
    loop.join(30)
    arrived = _arrivals(log)
    lags = sorted(arrived[k] - v for k, v in made.items() if k in arrived)
    return {
        "rate": rate,
        "made_per_s": making,
        "delivered": len(lags),
        "lost": count - len(lags),
        "lag_p50_s": lags[len(lags) // 2] if lags else float("nan"),
        "lag_p99_s": lags[int(len(lags) * 0.99) - 1] if lags else float("nan"),
    }


def _loop(app: Any, stop: threading.Event) -> None:
    while not stop.is_set():
        if not app.webhook_delivery.run_pass(stop).full:
            stop.wait(app.settings.webhook_poll_interval)


def run(events: int = 5_000, rate: float = 1_000.0, seconds: float = 10.0) -> dict[str, Any]:
    """Both measures, each on a fresh store and receiver."""
    out: dict[str, Any] = {}
    for name in ("drain", "lag"):
        with tempfile.TemporaryDirectory(prefix=f"bench-webhooks-{name}-") as tmp:
            home = Path(tmp)
            proc, port, log = _receiver(home)
            app = _app(home)
            try:
                app.webhooks.add(f"http://127.0.0.1:{port}/hook")
                if name == "drain":
                    out[name] = _drain(app, events)
                else:
                    out[name] = _lag(app, rate, seconds, log)
            finally:
                app.close()
                proc.kill()
                proc.wait(10)
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["receive"]:
        _receive(sys.argv[2], sys.argv[3])
    else:
        size = int(os.environ.get("EVENTS", "5000"))
        print(json.dumps(run(events=size), indent=2))
