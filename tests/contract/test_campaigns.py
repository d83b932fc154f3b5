"""The Campaigns contract (sendqueue.ports.Campaigns: campaigns and their recipients), run
against every backend of :mod:`tests.contract.store_backends`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from sendqueue.domain.errors import Conflict, IllegalTransition, InvalidField, NotFound
from sendqueue.domain.lifecycle import CampaignState
from sendqueue.domain.models import Recipient, task_id
from sendqueue.domain.steps import Step, parse_delay
from sendqueue.ports import TaskStore
from tests.contract.store_backends import (
    T0,
    S,
    all_changes,
    backend,
    campaign,
    make_task,
    recipients,
    store,
)

__all__ = ["backend", "store"]  # the fixtures: every backend's store


# --- campaigns --------------------------------------------------------------------------------


def test_create_and_get_campaign_round_trips(store: TaskStore) -> None:
    original = campaign(checkpoint={"after": 3, "nested": {"k": [1, 2]}}, state_reason="why")
    store.create_campaign(original, recipients(3))

    got = store.get_campaign("c1")

    assert got == replace(original, recipient_count=3)
    assert got.policy == original.policy
    assert got.policy.describe() == original.policy.describe()


def test_a_campaigns_steps_round_trip(store: TaskStore) -> None:
    steps = (
        Step(1, "Hello {{ name }}", "Dear {{ name }},\n", "<p>Dear {{ name }}</p>", None),
        Step(2, None, "Any thoughts?\n", None, parse_delay("3d")),
        Step(3, "A new thread", "Last note\n", None, parse_delay("4h"), new_thread=True),
    )
    store.create_campaign(campaign(steps=steps), recipients(1))
    store.create_campaign(campaign("c2"), recipients(1))

    assert store.get_campaign("c1").steps == steps
    assert store.get_campaign("c2").steps == ()  # stored without steps: its one email
    assert {c.id: c.steps for c in store.list_campaigns()} == {"c1": steps, "c2": ()}


def test_recipient_count_is_the_number_of_recipients(store: TaskStore) -> None:
    store.create_campaign(campaign(recipient_count=99), recipients(4))
    assert store.get_campaign("c1").recipient_count == 4


def test_list_campaigns_newest_first(store: TaskStore) -> None:
    assert store.list_campaigns() == []
    store.create_campaign(campaign("ca", created_at=T0), [])
    store.create_campaign(campaign("cc", created_at=T0 + timedelta(hours=2)), [])
    store.create_campaign(campaign("cb", created_at=T0 + timedelta(hours=1)), [])

    assert [c.id for c in store.list_campaigns()] == ["cc", "cb", "ca"]


def test_create_campaign_with_existing_id_conflicts(store: TaskStore) -> None:
    store.create_campaign(campaign(name="first"), recipients(2))

    with pytest.raises(Conflict):
        store.create_campaign(campaign(name="second"), recipients(5))

    assert store.get_campaign("c1").name == "first"
    assert len(store.list_recipients("c1")) == 2


def test_create_campaign_is_all_or_nothing(store: TaskStore) -> None:
    rows = recipients(1200)
    # A bad row deep in the list, after whole chunks went in.
    rows[900] = replace(rows[900], position=100)

    with pytest.raises(InvalidField) as info:
        store.create_campaign(campaign(), rows)

    assert info.value.field == "position"
    with pytest.raises(NotFound):
        store.get_campaign("c1")
    assert store.list_campaigns() == []
    assert store.last_change_id() == 0
    # Nothing left behind: the same id and positions go in cleanly now.
    store.create_campaign(campaign(), recipients(1200))
    assert len(store.list_recipients("c1", limit=5000)) == 1200


def test_create_campaign_consumes_a_one_pass_iterator(store: TaskStore) -> None:
    # A generator can be read only once: the store must not need len() or a second pass.
    store.create_campaign(campaign(recipient_count=0), (r for r in recipients(1200)))

    assert store.get_campaign("c1").recipient_count == 1200
    assert [r.position for r in store.list_recipients("c1", limit=5000)] == list(range(1200))


def test_create_campaign_from_a_failing_iterator_stores_nothing(store: TaskStore) -> None:
    class Broken(Exception):
        pass

    def rows() -> Iterator[Recipient]:
        yield from recipients(1100)
        raise Broken("the import failed after whole chunks went in")

    with pytest.raises(Broken):
        store.create_campaign(campaign(), rows())

    with pytest.raises(NotFound):
        store.get_campaign("c1")
    assert store.list_campaigns() == []
    assert store.last_change_id() == 0
    store.create_campaign(campaign(), iter(recipients(3)))
    assert store.get_campaign("c1").recipient_count == 3


def test_create_campaign_refuses_a_repeated_position_from_an_iterator(store: TaskStore) -> None:
    rows = recipients(1200)
    rows[1100] = replace(rows[1100], position=7)

    with pytest.raises(InvalidField) as info:
        store.create_campaign(campaign(), iter(rows))

    assert info.value.field == "position"
    assert store.list_campaigns() == []


def test_unknown_campaign_raises_not_found(store: TaskStore) -> None:
    calls: list[Callable[[], object]] = [
        lambda: store.get_campaign("nope"),
        lambda: store.set_campaign_state(
            "nope", {CampaignState.DRAFT}, CampaignState.PROVISIONING, at=T0
        ),
        lambda: store.save_checkpoint("nope", {"a": 1}, at=T0),
        lambda: store.list_recipients("nope"),
        lambda: store.list_tasks("nope"),
        lambda: store.count_tasks("nope"),
        lambda: store.transition_all("nope", S.PENDING, S.CANCELLED, at=T0),
        lambda: store.insert_tasks([make_task("nope", 0)], at=T0),
    ]
    for call in calls:
        with pytest.raises(NotFound) as info:
            call()
        assert (info.value.kind, info.value.ident) == ("campaign", "nope")
    assert store.get_task(task_id("nope", 0)) is None
    assert store.last_change_id() == 0


def test_set_campaign_state_is_compare_and_set_and_logged(store: TaskStore) -> None:
    store.create_campaign(campaign(), [])
    later = T0 + timedelta(minutes=5)

    assert store.set_campaign_state(
        "c1", {CampaignState.DRAFT}, CampaignState.PROVISIONING, at=later, reason="go"
    )
    # The state moved on, so the same compare-and-set no longer applies, and logs nothing.
    assert not store.set_campaign_state(
        "c1", {CampaignState.DRAFT}, CampaignState.PROVISIONING, at=later
    )
    assert store.set_campaign_state(
        "c1",
        {CampaignState.DRAFT, CampaignState.PROVISIONING, CampaignState.ACTIVE},
        CampaignState.CANCELLED,
        at=later,
        reason="user",
    )

    got = store.get_campaign("c1")
    assert (got.state, got.state_reason, got.updated_at) == (
        CampaignState.CANCELLED,
        "user",
        later,
    )
    assert [(e.task_id, e.from_state, e.to_state, e.note, e.at) for e in all_changes(store)] == [
        (None, "draft", "provisioning", "go", later),
        (None, "provisioning", "cancelled", "user", later),
    ]


def test_set_campaign_state_refuses_illegal_transitions(store: TaskStore) -> None:
    store.create_campaign(campaign(state=CampaignState.CANCELLED), [])

    with pytest.raises(IllegalTransition):
        store.set_campaign_state("c1", {CampaignState.CANCELLED}, CampaignState.ACTIVE, at=T0)
    with pytest.raises(IllegalTransition):
        store.set_campaign_state("c1", {CampaignState.DRAFT}, CampaignState.COMPLETED, at=T0)

    assert store.get_campaign("c1").state is CampaignState.CANCELLED
    assert store.last_change_id() == 0


def test_save_checkpoint(store: TaskStore) -> None:
    store.create_campaign(campaign(), [])
    later = T0 + timedelta(minutes=1)

    store.save_checkpoint("c1", {"after": 499, "done": [1, 2]}, at=later)
    assert store.last_change_id() == 0
    store.save_checkpoint("c1", {"after": 999}, at=later, note="1000 of 2000 tasks")

    got = store.get_campaign("c1")
    assert got.checkpoint == {"after": 999}
    assert got.updated_at == later
    [entry] = all_changes(store)
    assert (entry.campaign_id, entry.task_id, entry.to_state, entry.note) == (
        "c1",
        None,
        "progress",
        "1000 of 2000 tasks",
    )

    store.save_checkpoint("c1", None, at=later)
    assert store.get_campaign("c1").checkpoint is None


def test_returned_mappings_are_not_the_stored_ones(store: TaskStore) -> None:
    checkpoint: dict[str, Any] = {"after": 1}
    store.create_campaign(campaign(checkpoint=checkpoint), recipients(1))
    checkpoint["after"] = 2
    got = store.get_campaign("c1")
    assert got.checkpoint is not None
    got.checkpoint["after"] = 3  # type: ignore[index]
    variables = store.list_recipients("c1")[0].variables
    variables["n"] = "changed"  # type: ignore[index]

    assert store.get_campaign("c1").checkpoint == {"after": 1}
    assert store.list_recipients("c1")[0].variables == {"n": "0"}


# --- recipients -------------------------------------------------------------------------------


def test_list_recipients_pages_by_position(store: TaskStore) -> None:
    rows = recipients(25)
    store.create_campaign(campaign(), list(reversed(rows)))

    pages: list[list[Recipient]] = []
    after = -1
    while page := store.list_recipients("c1", after=after, limit=10):
        pages.append(page)
        after = page[-1].position

    assert [len(p) for p in pages] == [10, 10, 5]
    assert [r for p in pages for r in p] == rows
    assert store.list_recipients("c1", after=24) == []


def test_campaign_state_reads_the_current_state(store: TaskStore) -> None:
    store.create_campaign(campaign(), [])
    assert store.campaign_state("c1") is CampaignState.DRAFT
    store.set_campaign_state("c1", {CampaignState.DRAFT}, CampaignState.PROVISIONING, at=T0)
    assert store.campaign_state("c1") is CampaignState.PROVISIONING
    with pytest.raises(NotFound):
        store.campaign_state("nope")
