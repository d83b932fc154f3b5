"""The SequenceEdits contract (sendqueue.ports.SequenceEdits: a campaign's steps replaced
under a compare-and-set, Pending emails re-rendered), run against every backend of
:mod:`tests.contract.store_backends`."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sendqueue.domain.errors import IllegalTransition, InvalidField, NotFound
from sendqueue.domain.steps import Step, parse_delay
from sendqueue.domain.transitions import rerender
from sendqueue.ports import StoreBackend
from tests.contract.store_backends import (
    T0,
    Backend,
    S,
    all_changes,
    backend,
    campaign,
    drive,
    recipients,
    store,
    with_tasks,
)

__all__ = ["backend", "store"]  # the fixtures: every backend's store

ONE = (Step(1, "Hello {{ name }}", "Dear {{ name }}\n", None, None),)
TWO = (*ONE, Step(2, None, "Any news?\n", "<p>Any news?</p>", parse_delay("3d")))
THREE = (*TWO, Step(3, "Last", "Last note\n", None, parse_delay("4h"), new_thread=True))


def test_replace_steps_writes_them_while_they_are_the_expected_ones(store: StoreBackend) -> None:
    store.create_campaign(campaign(steps=TWO), recipients(1))
    later = T0 + timedelta(hours=1)

    assert store.replace_steps("c1", TWO, THREE, at=later)
    got = store.get_campaign("c1")
    assert got.steps == THREE
    assert got.updated_at == later
    assert got.state is campaign().state  # only the steps changed


def test_of_two_editors_who_read_the_same_steps_one_wins(store: StoreBackend) -> None:
    store.create_campaign(campaign(steps=TWO), recipients(1))
    edited = (TWO[0], Step(2, "Edited", "Other text\n", None, parse_delay("2d")))

    assert store.replace_steps("c1", TWO, THREE, at=T0)
    assert not store.replace_steps("c1", TWO, edited, at=T0)  # read TWO: lost to the first
    assert store.get_campaign("c1").steps == THREE


def test_replace_steps_of_a_campaign_stored_without_steps(store: StoreBackend) -> None:
    store.create_campaign(campaign(), recipients(1))

    assert not store.replace_steps("c1", ONE, TWO, at=T0)
    assert store.replace_steps("c1", (), ONE, at=T0)
    assert store.get_campaign("c1").steps == ONE


def test_replace_steps_refuses_an_unknown_campaign_and_bad_steps(store: StoreBackend) -> None:
    with pytest.raises(NotFound):
        store.replace_steps("nope", (), ONE, at=T0)
    store.create_campaign(campaign(steps=ONE), recipients(1))
    with pytest.raises(InvalidField):
        store.replace_steps("c1", ONE, (), at=T0)
    assert store.get_campaign("c1").steps == ONE


def test_rerender_changes_only_pending_tasks_holding_their_token(store: StoreBackend) -> None:
    tasks = with_tasks(store, count=4)
    drive(store, tasks[1].id, S.RUNNING)
    later = T0 + timedelta(minutes=30)
    stale = rerender(tasks[2], "Stale", "stale\n", None)._replace(token="another")
    edits = [rerender(tasks[0], "New 0", "new 0\n", "<p>0</p>"), stale]
    edits.append(rerender(tasks[3], "New 3", "new 3\n", None))
    edits.append(rerender(tasks[1], "Claimed", "x\n", None))  # read Pending, claimed since
    before = len(all_changes(store, "c1"))

    assert store.rerender(edits, at=later, note="re-rendered: step 1 edited") == 2
    got = store.get_tasks([t.id for t in tasks])
    first, claimed, untouched, last = (got[t.id] for t in tasks)
    assert (first.subject, first.text, first.html) == ("New 0", "new 0\n", "<p>0</p>")
    assert (first.token, first.send_at, first.state) == (
        tasks[0].token,
        tasks[0].send_at,
        S.PENDING,
    )
    assert first.updated_at == later
    assert (last.subject, last.text, last.html) == ("New 3", "new 3\n", None)
    assert (claimed.subject, untouched.subject) == (tasks[1].subject, tasks[2].subject)
    entries = all_changes(store, "c1")[before:]
    assert sorted(e.task_id or "" for e in entries) == [tasks[0].id, tasks[3].id]
    assert {(e.from_state, e.to_state, e.note) for e in entries} == {
        ("Pending", "Pending", "re-rendered: step 1 edited")
    }


def test_rerender_of_nothing_and_of_unknown_tasks(store: StoreBackend) -> None:
    tasks = with_tasks(store, count=1)
    gone = rerender(tasks[0], "S", "t\n", None)._replace(task_id="c1-99")

    assert store.rerender([], at=T0, note="n") == 0
    assert store.rerender([gone], at=T0, note="n") == 0


def test_rerender_is_built_only_for_a_pending_task(store: StoreBackend) -> None:
    tasks = with_tasks(store, count=1)
    drive(store, tasks[0].id, S.RUNNING)
    claimed = store.get_task(tasks[0].id)
    assert claimed is not None
    with pytest.raises(IllegalTransition):
        rerender(claimed, "S", "t\n", None)


def test_steps_a_store_cannot_hold_are_refused_naming_the_step(
    backend: Backend, store: StoreBackend
) -> None:
    # 60 KB of text and 500 KB of HTML: past a DynamoDB item (the steps live in the campaign's)
    big = (*TWO, Step(3, None, "x" * 60_000, "<p>" + "y" * 500_000 + "</p>", parse_delay("1d")))
    store.create_campaign(campaign(steps=TWO), recipients(1))
    if backend.name != "dynamodb":
        assert store.replace_steps("c1", TWO, big, at=T0)
        return
    with pytest.raises(InvalidField) as exc:  # not StoreUnavailable: trying again never helps
        store.replace_steps("c1", TWO, big, at=T0)
    assert exc.value.field == "steps[3]"
    assert store.get_campaign("c1").steps == TWO
