"""The one-click unsubscribe latency: POST to the address suppressed and its other
Pending emails cancelled.

``recipients`` addresses each got an email of a sent campaign and have a Pending email in each
of ``others`` later campaigns. Each one's link is POSTed (``List-Unsubscribe=One-Click``)
through the real web server (uvicorn with every middleware, on 127.0.0.1, one kept-alive
connection); the request's time is from sending it to its 200, which the route answers only
after the feedback service has listed the address and cancelled its Pending emails. Every
answer is checked afterwards: each address listed, each other email Cancelled with the reason
"suppressed: unsubscribed".

``store`` is ``memory`` (the in-memory store, the route's own cost), ``sqlite`` (a file in a
temporary directory, the embedded default) or ``postgres`` (a fresh database on the server of
bench.common, dropped afterwards). Run:
``python -m bench.unsubscribe [--recipients N] [--store memory|sqlite|postgres ...]``.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from bench.common import percentile, summarize

__all__ = ["run"]

_T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
_SECRET = "bench-unsubscribe-key-0123456789abcdef"


def _campaign(app: Any, count: int, start: datetime, name: str) -> str:
    from sendqueue.domain.policy import SendingPolicy, Window
    from sendqueue.services.templates.render import Templates

    rows = "".join(f"reader{i}@example.com,Hello\n" for i in range(count))
    policy = SendingPolicy(
        timezone="UTC",
        per_day=10_000,
        weekdays=frozenset(range(7)),
        windows=(Window(0, 1440),),
        start=start,
    )
    cid: str = app.campaign_import.create(
        name=name,
        recipients=f"email,subject\n{rows}".encode(),
        policy=policy,
        templates=Templates(body="Hi. Leave: {{ unsubscribe_url }}"),
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    return cid


def run(recipients: int = 200, others: int = 2, store: str = "memory") -> dict[str, Any]:
    """One measurement on ``store`` (see the module's docstring)."""
    import tempfile

    from bench.common import postgres_database

    if store == "memory":
        return _run(recipients, others, None, store)
    if store == "sqlite":
        with tempfile.TemporaryDirectory(prefix="sq-bench-unsub-") as home:
            return _run(recipients, others, f"sqlite:///{home}/store.db", store)
    if store == "postgres":
        with postgres_database() as url:
            return _run(recipients, others, url, store)
    raise ValueError(f"store: expected memory, sqlite or postgres, not {store!r}")


def _run(recipients: int, others: int, url: str | None, store_name: str) -> dict[str, Any]:
    import httpx

    from sendqueue.adapters.sql import open_store
    from sendqueue.bootstrap import bootstrap
    from sendqueue.domain.lifecycle import TaskState
    from sendqueue.settings import Settings
    from sendqueue.testing.clock import FakeClock
    from sendqueue.testing.mailer import RecordingMailer
    from sendqueue.testing.scheduler import FakeScheduler
    from sendqueue.testing.store import InMemoryTaskStore
    from sendqueue.web.app import build_server, create_app

    clock = FakeClock(_T0)
    settings = Settings(
        _env_file=None,
        public_url="https://mail.example.com",
        secret_key=_SECRET,
        unsubscribe_rate=100_000,
        max_lateness=30 * 86_400.0,
        space_late_sends=False,
    )
    scheduler = FakeScheduler(clock, seed=1)
    app = bootstrap(
        settings,
        clock=clock,
        store=InMemoryTaskStore() if url is None else open_store(url),
        scheduler=scheduler,
        mailer=RecordingMailer(),
    )
    sent = _campaign(app, recipients, _T0, "sent")
    later = [
        _campaign(app, recipients, _T0 + timedelta(days=10), f"later{i}") for i in range(others)
    ]
    clock.advance(hours=1)
    scheduler.fire_due(app.invoke)
    tasks = app.store.list_tasks(sent, limit=recipients)
    assert len(tasks) == recipients
    assert all(t.state is TaskState.FINISHED for t in tasks)
    links = settings.unsubscribe_links
    assert links is not None
    paths = [urlsplit(links.url(t.id)).path for t in tasks]

    server = build_server(create_app(app), host="127.0.0.1", port=0)
    thread = threading.Thread(target=server.run, name="bench-uvicorn", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    timings: list[float] = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            client.get("/healthz")  # the connection made before the first timing
            for path in paths:
                started = time.perf_counter()
                response = client.post(path, data={"List-Unsubscribe": "One-Click"})
                timings.append(time.perf_counter() - started)
                if response.status_code != 200:
                    raise AssertionError(f"POST {path}: {response.status_code} {response.text}")
    finally:
        server.should_exit = True
        thread.join(20)
    listed = app.suppressions.suppressed([t.email for t in tasks])
    assert len(listed) == recipients, "every address is listed"
    for cid in later:
        for task in app.store.list_tasks(cid, limit=recipients):
            assert task.state is TaskState.CANCELLED, task
            assert task.reason == "suppressed: unsubscribed", task
    app.close()
    ms = [t * 1000 for t in timings]
    summary = summarize(ms)
    return {
        "requests": len(ms),
        "other_pending_per_address": others,
        "median_ms": round(summary.median, 2),
        "p99_ms": round(percentile(ms, 0.99), 2),
        "max_ms": round(summary.max, 2),
        "store": store_name,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipients", type=int, default=200)
    parser.add_argument("--others", type=int, default=2)
    parser.add_argument(
        "--store",
        action="append",
        choices=("memory", "sqlite", "postgres"),
        help="the task store (repeatable: measured one after the other; default memory)",
    )
    args = parser.parse_args()
    results = [run(args.recipients, args.others, store) for store in args.store or ["memory"]]
    print(json.dumps(results if len(results) > 1 else results[0], indent=2))


if __name__ == "__main__":
    main()
