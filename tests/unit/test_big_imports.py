"""Big imports (issue #17): a CSV is checked whole, then streamed into the store in chunks, never
held as a list; a stored campaign's plan preview is cached per campaign."""

from __future__ import annotations

import io
import tracemalloc
from collections.abc import Iterable, Sequence
from contextlib import closing
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sendqueue.bootstrap import bootstrap
from sendqueue.domain import planner
from sendqueue.domain.errors import InvalidInput
from sendqueue.domain.models import Campaign, Recipient
from sendqueue.domain.policy import SendingPolicy
from sendqueue.services.campaigns import controls as controls_module
from sendqueue.services.campaigns import preview as previews_module
from sendqueue.services.campaigns.preview import PREVIEW_CACHE_SIZE
from sendqueue.services.importing.recipients import ImportLimits, Templates
from sendqueue.services.importing.stream import check_csv
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.app import T0, csv_bytes, fake_app, open_policy


class RecordingStore(InMemoryTaskStore):
    """Notes what ``create_campaign`` was given."""

    def __init__(self) -> None:
        super().__init__()
        self.given: list[type] = []

    def create_campaign(self, campaign: Campaign, recipients: Iterable[Recipient]) -> None:
        self.given.append(type(recipients))
        super().create_campaign(campaign, recipients)


class OnePass(io.RawIOBase):
    """A stream that cannot seek, like a pipe."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        chunk = self._data.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)


def test_create_streams_the_recipients_into_the_store() -> None:
    store = RecordingStore()
    app = fake_app(store=store)

    created = app.campaign_import.create(
        name="big", recipients=csv_bytes(2500), policy=open_policy()
    )

    assert len(store.given) == 1
    assert not issubclass(store.given[0], Sequence)  # an iterator, not a list
    assert created.campaign.recipient_count == created.imported.count == 2500
    stored = store.list_recipients(created.campaign.id, limit=5000)
    assert [r.position for r in stored] == list(range(2500))
    assert stored[1234].email == "user1234@example.com"


def test_a_stream_that_cannot_seek_is_read_once() -> None:
    app = fake_app()
    data = csv_bytes(30) + b"user3@example.com,Again,Dup,Dup\n"

    created = app.campaign_import.create(
        name="pipe",
        recipients=OnePass(data),  # type: ignore[arg-type]
        policy=open_policy(),
    )

    assert created.imported.count == 30
    assert created.imported.duplicates == 1
    assert len(app.store.list_recipients(created.campaign.id, limit=100)) == 30


def test_a_rejected_import_stores_nothing_even_with_the_bad_row_last() -> None:
    app = fake_app()
    data = csv_bytes(3000) + b"not-an-address,X,Y,Z\n"

    with pytest.raises(InvalidInput) as info:
        app.campaign_import.create(name="bad", recipients=data, policy=open_policy())

    assert info.value.errors[0].field == "email"
    assert info.value.errors[0].row == 3002
    assert app.store.list_campaigns() == []


def test_checking_a_csv_keeps_no_recipient_list_in_memory() -> None:
    data = csv_bytes(20_000)
    templates = Templates(subject="Hello {{ name }}")
    tracemalloc.start()
    try:
        checked = check_csv(data, templates=templates, limits=ImportLimits())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A list of 20,000 recipients took 19 MB here; the check keeps hashes and 1,000 addresses.
    assert checked.count == 20_000
    assert peak < 8 * 1024 * 1024, f"peak {peak / 1e6:.1f} MB"
    again = checked.recipients()
    assert next(again).email == "user0@example.com"
    assert sum(1 for _ in again) == 19_999


def test_creating_into_sqlite_holds_memory_flat_as_the_csv_grows(tmp_path: Path) -> None:
    """The whole create (check, then the stream into a real SQLite store): a list of
    recipients cost about 800 bytes a row here (13 MB more for 16,000 more rows); the
    streaming create keeps a hash per row (about 140 bytes at these sizes) and chunks of 1,000."""
    settings = Settings(
        _env_file=None,
        database_url=f"sqlite:///{tmp_path / 'store.db'}",
        scheduler_url=f"sqlite:///{tmp_path / 'scheduler.db'}",
        mailer=f"maildir:{tmp_path / 'outbox'}",
    )
    peaks = {}
    with closing(bootstrap(settings)) as c:
        c.campaign_import.create(name="warm", recipients=csv_bytes(10), policy=open_policy())
        for rows in (8_000, 24_000):
            path = tmp_path / f"r{rows}.csv"
            path.write_bytes(csv_bytes(rows))
            tracemalloc.start()
            try:
                created = c.campaign_import.create(
                    name=f"big {rows}", recipients=path, policy=open_policy(),
                    templates=Templates(subject="Hello {{ name }}"),
                )  # fmt: skip
                _, peaks[rows] = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert created.campaign.recipient_count == rows

    grown = peaks[24_000] - peaks[8_000]
    assert grown < 300 * 16_000, f"{grown / 16_000:.0f} bytes a row ({peaks})"


# -- the preview cache --------------------------------------------------------------------------


@pytest.fixture
def planner_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = planner.plan

    def counting(policy: SendingPolicy, count: int, *, now: datetime) -> list[datetime]:
        calls.append(count)
        return real(policy, count, now=now)

    monkeypatch.setattr(controls_module, "plan", counting)  # check_plannable
    monkeypatch.setattr(previews_module, "plan", counting)  # the preview's plan
    return calls


def test_a_second_preview_does_not_plan_again(planner_calls: list[int]) -> None:
    clock = FakeClock(T0 + timedelta(seconds=20))
    app = fake_app(clock=clock)
    cid = app.campaign_import.create(
        name="p", recipients=csv_bytes(1500), policy=SendingPolicy(per_day=200)
    ).campaign.id
    planner_calls.clear()

    first = app.campaign_previews.preview_summary(cid)
    clock.advance(seconds=30)  # still inside the same minute
    second = app.campaign_previews.preview_summary(cid)

    assert planner_calls == [1500]
    assert second == first
    assert first.count == 1500
    assert first.emails[:2] == ("user0@example.com", "user1@example.com")
    assert len(first.first) == len(first.emails) == 1000
    assert sum(day.count for day in first.days) == 1500
    # The plan starts at the next whole minute: no send before the request.
    assert first.first[0] >= T0 + timedelta(minutes=1)


def test_the_preview_plans_again_when_its_inputs_change(planner_calls: list[int]) -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    cid = app.campaign_import.create(
        name="p", recipients=csv_bytes(5), policy=open_policy()
    ).campaign.id
    planner_calls.clear()

    app.campaign_previews.preview_summary(cid)
    clock.advance(minutes=1)
    app.campaign_previews.preview_summary(cid)  # a new minute
    app.campaign_controls.start_provisioning(cid)
    planned = len(planner_calls)
    app.campaign_previews.preview_summary(cid)  # provisioning dropped the entry; the state changed

    assert planner_calls[:2] == [5, 5]
    assert len(planner_calls) == planned + 1


def test_the_preview_cache_is_bounded(planner_calls: list[int]) -> None:
    app = fake_app()
    ids = [
        app.campaign_import.create(
            name=f"p{i}", recipients=csv_bytes(2), policy=open_policy()
        ).campaign.id
        for i in range(PREVIEW_CACHE_SIZE + 1)
    ]
    for cid in ids:
        app.campaign_previews.preview_summary(cid)
    planner_calls.clear()

    app.campaign_previews.preview_summary(ids[-1])  # still cached
    app.campaign_previews.preview_summary(ids[0])  # the oldest, evicted

    assert planner_calls == [2]
