"""How many store calls a page and an API read make: one each for the campaign list, the campaign
page, the task list and the email page (the read side's one-call views,
sendqueue.services.reading.queries).

The store is wrapped in a proxy that records every call by name. The "needs attention" banner
(kept 5 s) and a campaign's timeline (kept until its change log moves) are warmed by a first
request; what a request reads then is its own view.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*install `httpx2`")
    from fastapi.testclient import TestClient

from sendqueue.adapters.sql import open_store
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.senders import Sender
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.web.app import create_app
from tests.support.app import T0
from tests.web.conftest import sqlite_settings


class CountingStore:
    """Wraps a task store and records the name of every method called on it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls.append(name)
            return attr(*args, **kwargs)

        return call

    def take(self) -> list[str]:
        """The calls since the last take."""
        with self._lock:
            calls, self.calls = self.calls, []
        return calls


@dataclass
class Counted:
    container: Container
    client: TestClient
    store: CountingStore

    def calls_of(self, path: str) -> list[str]:
        """The store calls one GET of ``path`` makes (after the banner and timeline are warm)."""
        assert self.client.get(path).status_code == 200
        self.store.take()
        response = self.client.get(path)
        assert response.status_code == 200, response.text
        return self.store.take()


@pytest.fixture
def counted(tmp_path: Path) -> Iterator[Counted]:
    settings = sqlite_settings(tmp_path)
    store = CountingStore(open_store(settings.database_url, upgrade=True))
    container = bootstrap(settings, clock=FakeClock(T0), mailer=RecordingMailer(), store=store)
    client = TestClient(create_app(container), base_url="http://testserver")
    client.__enter__()
    try:
        yield Counted(container, client, store)
    finally:
        client.__exit__(None, None, None)
        container.close()


def _active(counted: Counted, name: str, count: int = 3, **body: Any) -> str:
    payload = {
        "name": name,
        "recipients": [{"email": f"user{i}@example.com"} for i in range(count)],
        "templates": {"subject": "Hello", "body": "Hi"},
        "policy": {
            "timezone": "UTC",
            "per_day": 1000,
            "weekdays": "mon-sun",
            "windows": ["00:00-24:00"],
        },
        **body,
    }
    response = counted.client.post("/api/campaigns", json=payload)
    assert response.status_code == 201, response.text
    cid: str = response.json()["id"]
    assert counted.container.provisioner.provision(cid).status == "done"
    return cid


def test_the_campaign_list_is_one_store_call_however_many_campaigns(counted: Counted) -> None:
    for name in ("One", "Two", "Three"):
        _active(counted, name)
    assert counted.calls_of("/") == ["all_campaign_figures"]
    assert counted.calls_of("/api/campaigns") == ["all_campaign_figures"]


def test_the_campaign_page_is_one_store_call_with_or_without_a_filter(counted: Counted) -> None:
    cid = _active(counted, "News")
    assert counted.calls_of(f"/campaigns/{cid}") == ["campaign_page"]
    filtered = f"/campaigns/{cid}?state=Pending&search=user1&after=0"
    assert counted.calls_of(filtered) == ["campaign_page"]
    assert counted.calls_of(f"/api/campaigns/{cid}") == ["campaign_figures"]


def test_the_task_list_is_one_store_call(counted: Counted) -> None:
    cid = _active(counted, "News", count=5)
    assert counted.calls_of(f"/api/campaigns/{cid}/tasks") == ["task_listing"]
    assert counted.calls_of(f"/api/campaigns/{cid}/tasks?state=Pending&limit=2") == ["task_listing"]


_SIGNED = {"subject": "Hello from {{ sender.name }}", "body": "Hi"}


def test_the_email_page_is_one_store_call_with_or_without_a_sender(counted: Counted) -> None:
    counted.container.sender_store.add_sender(
        Sender(id="s1", email="anna@example.com", name="Anna")
    )
    for cid in (
        _active(counted, "Plain"),
        _active(counted, "Signed", senders=["s1"], templates=_SIGNED),
    ):
        task = counted.client.get(f"/api/campaigns/{cid}/tasks").json()["tasks"][0]
        path = f"/campaigns/{cid}/emails/{task['id']}"
        assert counted.calls_of(path) == ["task_detail"]
    assert task["sender"] == "anna@example.com"
    # the sender read in that one call fills in the message
    assert "Hello from Anna" in counted.client.get(path).text


def test_a_change_to_the_campaign_recounts_its_timeline(counted: Counted) -> None:
    cid = _active(counted, "News", count=2)
    before = counted.client.get(f"/api/campaigns/{cid}").json()["timeline"]
    assert [day["planned"] for day in before] == [2]
    counted.store.take()
    task = counted.client.get(f"/api/campaigns/{cid}/tasks").json()["tasks"][0]
    assert counted.client.post(f"/api/campaigns/{cid}/tasks/{task['id']}/cancel").status_code == 200
    counted.store.take()
    after = counted.client.get(f"/api/campaigns/{cid}")
    calls = counted.store.take()
    # the campaign's read says its log moved: the kept timeline is recounted from its tasks
    assert calls[0] == "campaign_figures"
    assert "list_tasks" in calls[1:]
    assert [day["planned"] for day in after.json()["timeline"]] == [1]
    # and kept again: the next read is one call
    counted.client.get(f"/api/campaigns/{cid}")
    assert counted.store.take() == ["campaign_figures"]
