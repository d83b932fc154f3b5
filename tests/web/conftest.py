"""Fixtures for the web app: a Container on real SQLite files, the app, clients, a server.

- ``make_web(**settings)``: the app over a Container whose task store and execution layer are
  SQLite files in ``tmp_path`` (the embedded default), with a :class:`FakeClock` and a
  :class:`RecordingMailer`, served in-process by Starlette's TestClient. ``store=`` wraps the
  store (e.g. :class:`FlakyStore` to take it down).
- ``live_server(container, stream=...)``: the same app under a real uvicorn server on
  127.0.0.1 in a thread, for the event stream (whose tests need real sockets).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

with warnings.catch_warnings():
    # Starlette asks for the httpx2 package and warns when it falls back to httpx, which works
    # the same; the project depends on httpx.
    warnings.filterwarnings("ignore", message=".*install `httpx2`")
    from fastapi.testclient import TestClient

from sendqueue.adapters.sql import open_store
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.errors import StoreUnavailable
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.web.app import Server, create_app, server_url
from sendqueue.web.stream import StreamConfig
from tests.support.app import T0

TOKEN = "a-token-of-twenty-chars"


def sqlite_settings(home: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "_env_file": None,
        "database_url": f"sqlite:///{home / 'store.db'}",
        "scheduler_url": f"sqlite:///{home / 'scheduler.db'}",
        "mailer": f"maildir:{home / 'outbox'}",
        "default_timezone": "UTC",
        "retry_backoff": 60.0,
        "auto_pause_after": 0,
        # fire_due() sends everything due on the fake clock at once, late: a backlog, not the
        # spacing of late sends, is what these tests need (tests/unit/test_late_sends.py has it)
        "space_late_sends": False,
        # a send's next sequence step made before fire_due() returns, where a test reads it
        "follow_up_linger": 0.0,
    }
    values.update(overrides)
    return Settings(**values)


class FlakyStore:
    """Wraps a task store: while ``down`` every call raises StoreUnavailable; counts
    ``changes_after`` calls (``reads``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.down = False
        self.error_text = "injected: the database is unreachable"
        self.reads = 0
        self._lock = threading.Lock()

    def changes_after(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.reads += 1
        return self.__getattr__("changes_after")(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                raise StoreUnavailable(self.error_text)
            return attr(*args, **kwargs)

        return call


@dataclass
class Web:
    """An app under test and what it runs on."""

    container: Container
    app: FastAPI
    client: TestClient
    clock: FakeClock
    mailer: RecordingMailer
    store: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def create(self, count: int = 3, **body: Any) -> dict[str, Any]:
        """A draft over the JSON API: ``count`` recipients user0@example.com..., all day."""
        payload: dict[str, Any] = {
            "name": "News",
            "recipients": [
                {"email": f"user{i}@example.com", "name": f"User {i}"} for i in range(count)
            ],
            "templates": {"subject": "Hello {{ name }}", "body": "Hi {{ name }}"},
            "policy": {
                "timezone": "UTC",
                "per_day": 10_000,
                "weekdays": "mon-sun",
                "windows": ["00:00-24:00"],
            },
        }
        payload.update(body)
        response = self.client.post("/api/campaigns", json=payload)
        assert response.status_code == 201, response.text
        data: dict[str, Any] = response.json()
        return data

    def active(self, count: int = 3) -> str:
        """An active campaign (provisioned in this thread, not the API's background)."""
        cid: str = self.create(count)["id"]
        assert self.container.provisioner.provision(cid).status == "done"
        return cid

    def fire_due(self) -> int:
        """Run the execution layer's due schedules now (FakeClock time)."""
        scheduler: Any = self.container.scheduler  # the embedded one: fire_due is not in the port
        fired: int = scheduler.fire_due(self.container.invoke)
        return fired


@pytest.fixture
def make_web(tmp_path: Path) -> Iterator[Callable[..., Web]]:
    made: list[Web] = []

    def make(*, flaky: bool = False, **overrides: Any) -> Web:
        home = tmp_path / f"web{len(made)}"
        home.mkdir()
        settings = sqlite_settings(home, **overrides)
        clock = FakeClock(T0)
        mailer = RecordingMailer()
        store: Any = None
        if flaky:
            store = FlakyStore(open_store(settings.database_url, upgrade=True))
        container = bootstrap(settings, clock=clock, mailer=mailer, store=store)
        app = create_app(container)
        client = TestClient(app, base_url="http://testserver", follow_redirects=False)
        client.__enter__()
        web = Web(container, app, client, clock, mailer, store)
        made.append(web)
        return web

    yield make
    for web in made:
        web.client.__exit__(None, None, None)
        web.container.close()


@pytest.fixture
def web(make_web: Callable[..., Web]) -> Web:
    return make_web()


@contextmanager
def live_server(
    container: Container, *, stream: StreamConfig | None = None
) -> Iterator[tuple[str, FastAPI]]:
    """The app over ``container`` under a real uvicorn server on 127.0.0.1 (a free port)."""
    import uvicorn

    app = create_app(container, stream=stream)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = Server(config, app.state.broker)
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise AssertionError("the test server did not start")
        time.sleep(0.02)
    try:
        yield server_url(server, "127.0.0.1").rstrip("/"), app
    finally:
        server.should_exit = True
        thread.join(20)
        assert not thread.is_alive(), "the test server did not stop within 20 s"
