"""The FeedbackOutcomes contract (sendqueue.ports.FeedbackOutcomes; the cursors' is
``test_feedback_cursors``), and what an unreachable FeedbackStore raises, run against every
task store.

The backends are the store contracts' (:mod:`tests.contract.store_backends`): memory,
SQLite, PostgreSQL and DynamoDB on moto. Besides the port's own calls: task outcomes written
through a transition's ``TaskChanges``, and a campaign's reply and footer options, round-trip.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import date, datetime, timedelta
from typing import Protocol

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from sendqueue.domain.errors import InvalidField, StoreUnavailable
from sendqueue.domain.feedback import UNVERIFIED_NOTE, outcome_note
from sendqueue.domain.lifecycle import CampaignState, StopOnReply, TaskOutcome, TaskState
from sendqueue.domain.models import TaskChanges
from sendqueue.ports import FeedbackStore, TaskStore
from sendqueue.testing.store import InMemoryTaskStore
from tests.contract.store_backends import (
    T0,
    Backend,
    all_changes,
    backend,
    campaign,
    drive,
    is_utc,
    make_task,
    recipients,
)

Out = TaskOutcome
S = TaskState

__all__ = ["backend"]  # the fixture: every store of the TaskStore contract


class Store(TaskStore, FeedbackStore, Protocol):
    """Every task store is a feedback store too."""


@pytest.fixture
def store(backend: Backend) -> Store:
    return backend.handle()


def finish(store: Store, tid: str, *, outcome: Out | None = None, minutes: int = 0) -> None:
    """Send a Pending task: Running, then Finished (with ``outcome`` as the worker writes it)."""
    at = T0 + timedelta(minutes=minutes)
    drive(store, tid, S.RUNNING, at)
    changes: TaskChanges = {"sent_at": at, "message_id": f"<{tid}@example.com>"}
    if outcome is not None:
        changes["outcome"] = outcome
        changes["outcome_at"] = at
    assert store.transition(tid, S.RUNNING, S.FINISHED, at=at, changes=changes)


def sent_campaign(store: Store, cid: str = "c1", count: int = 3) -> None:
    """Campaign ``cid`` with ``count`` tasks (r<i>@example.com), all sent without an outcome."""
    store.create_campaign(campaign(cid), recipients(count))
    store.insert_tasks([make_task(cid, i) for i in range(count)], at=T0)
    for i in range(count):
        finish(store, f"{cid}-{i}")


# --- set_outcome ------------------------------------------------------------------------------


def test_the_finished_transition_carries_the_accepted_outcome(store: Store) -> None:
    store.create_campaign(campaign(), recipients(1))
    store.insert_tasks([make_task("c1", 0)], at=T0)
    finish(store, "c1-0", outcome=Out.ACCEPTED, minutes=5)
    got = store.get_task("c1-0")
    assert got is not None
    assert (got.outcome, got.outcome_detail, got.outcome_at) == (Out.ACCEPTED, None, got.sent_at)
    assert got.outcome_at is not None and is_utc(got.outcome_at)
    assert got.outcome_at == T0 + timedelta(minutes=5)
    assert store.get_tasks(["c1-0"])["c1-0"] == got
    assert store.list_tasks("c1") == [got]


def test_set_outcome_records_it_and_logs_it_in_the_same_write(store: Store) -> None:
    sent_campaign(store, count=2)
    before = store.last_change_id()
    at = T0 + timedelta(hours=2)
    detail = "5.1.1 smtp; 550 5.1.1 user unknown"

    updated = store.set_outcome("c1-1", Out.BOUNCED, detail=detail, at=at)

    assert updated is not None
    assert (updated.outcome, updated.outcome_detail) == (Out.BOUNCED, detail)
    assert updated.outcome_at == at
    assert updated.state is S.FINISHED and updated.updated_at == at
    assert store.get_task("c1-1") == updated
    entries = all_changes(store, after=before)
    assert [(e.campaign_id, e.task_id, e.from_state, e.to_state, e.note) for e in entries] == [
        ("c1", "c1-1", "Finished", "Finished", outcome_note(Out.BOUNCED))
    ]
    assert entries[0].note == "outcome: bounced"
    assert entries[0].at == at
    untouched = store.get_task("c1-0")
    assert untouched is not None and untouched.outcome is None


def test_set_outcome_changes_nothing_unless_the_task_is_finished_with_another_outcome(
    store: Store,
) -> None:
    store.create_campaign(campaign(), recipients(5))
    store.insert_tasks([make_task("c1", i) for i in range(5)], at=T0)
    drive(store, "c1-1", S.RUNNING)
    drive(store, "c1-2", S.FAILED)
    assert store.transition("c1-3", S.PENDING, S.CANCELLED, at=T0, changes={"reason": "manual"})
    finish(store, "c1-4", outcome=Out.ACCEPTED)
    before = store.last_change_id()
    snapshot = {t.id: t for t in store.list_tasks("c1")}
    at = T0 + timedelta(hours=1)

    for tid in ("c1-0", "c1-1", "c1-2", "c1-3", "no-such-task"):
        assert store.set_outcome(tid, Out.BOUNCED, detail="x", at=at) is None
    # The outcome it already has: nothing written, nothing logged.
    assert store.set_outcome("c1-4", Out.ACCEPTED, detail=None, at=at) is None

    assert {t.id: t for t in store.list_tasks("c1")} == snapshot
    assert store.last_change_id() == before


def test_an_unverified_reply_is_noted_on_an_accepted_task_once_and_logged(store: Store) -> None:
    store.create_campaign(campaign(), recipients(5))
    store.insert_tasks([make_task("c1", i) for i in range(5)], at=T0)
    finish(store, "c1-0", outcome=Out.ACCEPTED)
    finish(store, "c1-1", outcome=Out.ACCEPTED)
    assert store.set_outcome("c1-1", Out.REPLIED, detail="Re: Hi", at=T0)
    finish(store, "c1-2")  # sent before outcomes existed: none
    drive(store, "c1-3", S.RUNNING)
    before = store.last_change_id()
    at = T0 + timedelta(hours=1)

    noted = store.note_unverified_reply("c1-0", detail="unverified reply from a@b: hi", at=at)

    assert noted is not None
    assert (noted.outcome, noted.outcome_detail) == (Out.ACCEPTED, "unverified reply from a@b: hi")
    assert noted.updated_at == at and store.get_task("c1-0") == noted
    entries = all_changes(store, after=before)
    assert [(e.task_id, e.from_state, e.to_state, e.note, e.at) for e in entries] == [
        ("c1-0", "Finished", "Finished", UNVERIFIED_NOTE, at)
    ]
    # the first note is kept; another outcome, no outcome, not Finished, unknown: nothing
    snapshot = {t.id: t for t in store.list_tasks("c1")}
    mark = store.last_change_id()
    for tid in ("c1-0", "c1-1", "c1-2", "c1-3", "c1-4", "no-such-task"):
        assert store.note_unverified_reply(tid, detail="another", at=at) is None
    assert {t.id: t for t in store.list_tasks("c1")} == snapshot
    assert store.last_change_id() == mark


def test_accepted_never_replaces_another_outcome_but_others_replace_each_other(
    store: Store,
) -> None:
    sent_campaign(store, count=2)
    at = T0 + timedelta(hours=1)
    # A task sent before outcomes existed has none: accepted may be its first.
    first = store.set_outcome("c1-0", Out.ACCEPTED, detail=None, at=at)
    assert first is not None and first.outcome is Out.ACCEPTED
    assert store.set_outcome("c1-1", Out.REPLIED, detail="Re: Hello", at=at)
    again = store.set_outcome("c1-1", Out.ACCEPTED, detail=None, at=at + timedelta(minutes=1))
    assert again is None
    later = store.set_outcome("c1-1", Out.UNSUBSCRIBED, detail=None, at=at + timedelta(minutes=2))
    assert later is not None
    assert (later.outcome, later.outcome_detail) == (Out.UNSUBSCRIBED, None)
    assert later.outcome_at == at + timedelta(minutes=2)
    notes = [e.note for e in all_changes(store, "c1") if e.to_state == "Finished" == e.from_state]
    assert notes == ["outcome: accepted", "outcome: replied", "outcome: unsubscribed"]


def test_set_outcome_refuses_a_naive_time_and_an_unknown_outcome(store: Store) -> None:
    sent_campaign(store, count=1)
    with pytest.raises(ValueError, match="naive"):
        store.set_outcome("c1-0", Out.BOUNCED, detail=None, at=T0.replace(tzinfo=None))
    with pytest.raises(ValueError, match="lost"):
        store.set_outcome("c1-0", "lost", detail=None, at=T0)  # type: ignore[arg-type]
    got = store.get_task("c1-0")
    assert got is not None and got.outcome is None


def test_concurrent_set_outcome_of_one_task_writes_it_once(backend: Backend) -> None:
    handles = [backend.handle() for _ in range(4)]
    sent_campaign(handles[0], count=1)
    before = handles[0].last_change_id()
    barrier = threading.Barrier(len(handles))
    results: list[bool] = []

    def run(i: int, store: Store) -> None:
        barrier.wait()
        at = T0 + timedelta(hours=1, seconds=i)
        results.append(store.set_outcome("c1-0", Out.COMPLAINED, detail="abuse", at=at) is not None)

    threads = [threading.Thread(target=run, args=(i, s)) for i, s in enumerate(handles)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, False, False, True]
    assert len(all_changes(handles[0], after=before)) == 1


# --- tasks_for --------------------------------------------------------------------------------


def test_tasks_for_reads_an_address_across_campaigns_newest_first(store: Store) -> None:
    # The same person in three campaigns, under three spellings of the address.
    spellings = {"c1": "Ada@Example.com", "c2": "ada@example.com", "c3": "ADA@EXAMPLE.COM"}
    for n, (cid, email) in enumerate(spellings.items()):
        store.create_campaign(campaign(cid), recipients(3))
        store.insert_tasks(
            [
                make_task(cid, 0, email=email, send_at=T0 + timedelta(hours=n)),
                make_task(cid, 1, email="other@example.com", send_at=T0 + timedelta(hours=n)),
                make_task(cid, 2, email=email, send_at=T0 + timedelta(days=1, hours=n)),
            ],
            at=T0,
        )
    finish(store, "c1-0", outcome=Out.ACCEPTED)
    finish(store, "c3-0", outcome=Out.ACCEPTED)
    assert store.transition("c2-2", S.PENDING, S.CANCELLED, at=T0, changes={"reason": "x"})

    pending = store.tasks_for("ada@example.com", states=[S.PENDING])
    assert [t.id for t in pending] == ["c3-2", "c1-2", "c2-0"]
    assert pending[0] == store.get_task("c3-2")
    finished = store.tasks_for("ada@example.com", states=(S.FINISHED,))
    assert [t.id for t in finished] == ["c3-0", "c1-0"]
    every = store.tasks_for("ada@example.com", states=list(S))
    assert [t.id for t in every] == ["c3-2", "c2-2", "c1-2", "c3-0", "c2-0", "c1-0"]
    assert [t.id for t in store.tasks_for("ada@example.com", states=list(S), limit=2)] == [
        "c3-2",
        "c2-2",
    ]
    assert store.tasks_for("ada@example.com", states=list(S), limit=0) == []
    assert store.tasks_for("ada@example.com", states=[]) == []
    assert store.tasks_for("Ada@Example.com", states=list(S)) == []  # the compared form only
    assert store.tasks_for("nobody@example.com", states=list(S)) == []
    assert len(store.tasks_for("other@example.com", states=[S.PENDING])) == 3


def test_tasks_for_breaks_send_time_ties_by_id_descending(store: Store) -> None:
    store.create_campaign(campaign(), recipients(3))
    store.insert_tasks(
        [make_task("c1", i, email="same@example.com", send_at=T0) for i in range(3)], at=T0
    )
    found = store.tasks_for("same@example.com", states=[S.PENDING])
    assert [t.id for t in found] == ["c1-2", "c1-1", "c1-0"]


def test_tasks_for_compares_case_folded_not_lower_cased(store: Store) -> None:
    store.create_campaign(campaign(), recipients(2))
    store.insert_tasks(
        [
            make_task("c1", 0, email="Straße@example.com"),  # casefold: strasse@
            make_task("c1", 1, email="Ünïcode.Ĳ@example.com"),
        ],
        at=T0,
    )
    assert [t.id for t in store.tasks_for("strasse@example.com", states=[S.PENDING])] == ["c1-0"]
    assert store.tasks_for("straße@example.com", states=[S.PENDING]) == []
    assert [t.id for t in store.tasks_for("ünïcode.ĳ@example.com", states=[S.PENDING])] == ["c1-1"]


def test_tasks_for_follows_state_changes_and_moves(store: Store) -> None:
    store.create_campaign(campaign(), recipients(2))
    store.insert_tasks([make_task("c1", i, email="a@example.com") for i in range(2)], at=T0)
    assert [t.id for t in store.tasks_for("a@example.com", states=[S.PENDING])] == [
        "c1-1",
        "c1-0",
    ]
    finish(store, "c1-1")
    assert [t.id for t in store.tasks_for("a@example.com", states=[S.PENDING])] == ["c1-0"]
    assert [t.id for t in store.tasks_for("a@example.com", states=[S.FINISHED])] == ["c1-1"]


def test_tasks_for_refuses_a_negative_limit(store: Store) -> None:
    with pytest.raises(InvalidField) as info:
        store.tasks_for("a@example.com", states=[S.PENDING], limit=-1)
    assert info.value.field == "limit"


# --- soft bounces -----------------------------------------------------------------------------


def test_a_soft_bounce_is_kept_once_per_key_and_counted_since(store: Store) -> None:
    week = timedelta(days=7)

    def record(key: str, days: float, email: str = "a@example.com") -> int:
        at = T0 + timedelta(days=days)
        return store.record_soft_bounce(email, key, at=at, since=at - week)

    assert record("inbox:1:10", 0) == 1
    assert record("inbox:1:10", 0) == 1  # the same message read again
    assert record("inbox:1:10", 1) == 1  # ... even at another time: the first one stays
    assert record("inbox:1:11", 2) == 2
    assert record("inbox:1:12", 3, email="b@example.com") == 1  # another address
    assert record("inbox:1:13", 6.5) == 3
    # Eight days on, the first two have left the window; the key counted once stays so.
    assert record("inbox:1:14", 8) == 3
    assert record("inbox:1:10", 8) == 3
    at = T0 + timedelta(days=30)
    assert store.record_soft_bounce("a@example.com", "ses:x", at=at, since=T0) == 5
    # "at or after since": a bounce exactly at ``since`` counts.
    assert store.record_soft_bounce("c@example.com", "k", at=T0, since=T0) == 1


# --- counts and round trips -------------------------------------------------------------------


def test_count_outcomes_counts_a_campaigns_tasks_per_outcome(store: Store) -> None:
    sent_campaign(store, "c1", count=5)
    sent_campaign(store, "c2", count=1)
    assert store.count_outcomes("c1") == {}
    at = T0 + timedelta(hours=1)
    for tid, outcome in [
        ("c1-0", Out.ACCEPTED),
        ("c1-1", Out.ACCEPTED),
        ("c1-2", Out.BOUNCED),
        ("c1-3", Out.REPLIED),
        ("c2-0", Out.BOUNCED),
    ]:
        assert store.set_outcome(tid, outcome, detail=None, at=at)
    assert store.count_outcomes("c1") == {Out.ACCEPTED: 2, Out.BOUNCED: 1, Out.REPLIED: 1}
    assert store.count_outcomes("c2") == {Out.BOUNCED: 1}
    assert store.count_outcomes("no-such-campaign") == {}


def test_a_campaigns_reply_and_footer_options_round_trip(store: Store) -> None:
    plain = campaign("c1")
    assert (plain.stop_on_reply, plain.unsubscribe_footer) == (StopOnReply.SENDER, False)
    store.create_campaign(plain, [])
    chosen = campaign("c2", stop_on_reply=StopOnReply.OFF, unsubscribe_footer=True)
    store.create_campaign(chosen, [])
    scoped = campaign("c3", stop_on_reply=StopOnReply.CAMPAIGN)
    store.create_campaign(scoped, [])

    assert store.get_campaign("c1") == plain
    assert store.get_campaign("c2") == chosen
    assert {c.id: (c.stop_on_reply, c.unsubscribe_footer) for c in store.list_campaigns()} == {
        "c1": (StopOnReply.SENDER, False),
        "c2": (StopOnReply.OFF, True),
        "c3": (StopOnReply.CAMPAIGN, False),
    }
    # A state change keeps them.
    assert store.set_campaign_state("c2", [CampaignState.DRAFT], CampaignState.CANCELLED, at=T0)
    assert store.get_campaign("c2") == replace(chosen, state=CampaignState.CANCELLED, updated_at=T0)


def test_unreachable_backend_raises_store_unavailable(backend: Backend) -> None:
    store = backend.unreachable()
    calls: list[Callable[[], object]] = [
        lambda: store.set_outcome("c1-0", Out.BOUNCED, detail=None, at=T0),
        lambda: store.tasks_for("a@example.com", states=[S.PENDING]),
        lambda: store.record_soft_bounce("a@example.com", "k", at=T0, since=T0),
        lambda: store.feedback_cursor("box"),
        lambda: store.save_feedback_cursor("box", 1, 1),
        lambda: store.record_mailbox_pass("box", at=T0, messages=1, error=None),
        lambda: store.mailbox_states(["box"]),
        lambda: store.count_outcomes("c1"),
        lambda: store.set_away("c1", 0, date(2026, 12, 14), at=T0),
        lambda: store.away_until("c1", 0),
    ]
    for call in calls:
        with pytest.raises(StoreUnavailable):
            call()


def test_a_recipients_return_date_is_the_newest_notices(store: Store) -> None:
    store.create_campaign(campaign(), recipients(3))
    assert store.away_until("c1", 1) is None
    store.set_away("c1", 1, date(2026, 12, 14), at=T0)
    assert store.away_until("c1", 1) == date(2026, 12, 14)
    # an older notice, applied late, changes nothing; a newer one replaces it
    store.set_away("c1", 1, date(2026, 12, 20), at=T0 - timedelta(hours=1))
    assert store.away_until("c1", 1) == date(2026, 12, 14)
    store.set_away("c1", 1, date(2027, 1, 4), at=T0 + timedelta(hours=1))
    assert store.away_until("c1", 1) == date(2027, 1, 4)
    store.set_away("c1", 1, date(2027, 1, 5), at=T0 + timedelta(hours=1))  # as new: replaces
    assert store.away_until("c1", 1) == date(2027, 1, 5)
    # per campaign and position
    assert store.away_until("c1", 2) is None
    assert store.away_until("c2", 1) is None


# --- set_outcome's rules as a state machine (the memory store) --------------------------------


class OutcomeRules(RuleBasedStateMachine):
    """Random outcomes and states against a model: an outcome lands only on a Finished task
    with another outcome, accepted only on one with none; each landing is one log entry."""

    @initialize()
    def start(self) -> None:
        self.store = InMemoryTaskStore()
        self.store.create_campaign(campaign(), recipients(3))
        self.store.insert_tasks([make_task("c1", i) for i in range(3)], at=T0)
        self.state = dict.fromkeys(range(3), S.PENDING)
        self.outcome: dict[int, Out | None] = dict.fromkeys(range(3), None)
        self.logged = self.store.last_change_id()
        self.minute = 0

    def _at(self) -> datetime:
        self.minute += 1
        return T0 + timedelta(minutes=self.minute)

    @rule(i=st.integers(0, 2), accepted=st.booleans())
    def send(self, i: int, accepted: bool) -> None:
        if self.state[i] is not S.PENDING:
            return
        finish(self.store, f"c1-{i}", outcome=Out.ACCEPTED if accepted else None)
        self.state[i] = S.FINISHED
        self.outcome[i] = Out.ACCEPTED if accepted else None
        self.logged = self.store.last_change_id()

    @rule(i=st.integers(0, 2))
    def cancel(self, i: int) -> None:
        if self.state[i] is S.PENDING:
            assert self.store.transition(f"c1-{i}", S.PENDING, S.CANCELLED, at=T0)
            self.state[i] = S.CANCELLED
            self.logged = self.store.last_change_id()

    @rule(i=st.integers(0, 2), outcome=st.sampled_from(list(Out)), detail=st.text(max_size=5))
    def set_outcome(self, i: int, outcome: Out, detail: str) -> None:
        at = self._at()
        got = self.store.set_outcome(f"c1-{i}", outcome, detail=detail or None, at=at)
        current = self.outcome[i]
        lands = (
            self.state[i] is S.FINISHED
            and current is not outcome
            and (outcome is not Out.ACCEPTED or current is None)
        )
        assert (got is not None) == lands
        if got is not None:
            assert (got.outcome, got.outcome_detail, got.outcome_at) == (
                outcome,
                detail or None,
                at,
            )
            self.outcome[i] = outcome
            (entry,) = all_changes(self.store, after=self.logged)
            assert (entry.task_id, entry.note) == (f"c1-{i}", outcome_note(outcome))
            self.logged = entry.id
        else:
            assert self.store.last_change_id() == self.logged

    @invariant()
    def matches_the_model(self) -> None:
        for i in range(3):
            task = self.store.get_task(f"c1-{i}")
            assert task is not None
            assert (task.state, task.outcome) == (self.state[i], self.outcome[i])
        counts: dict[Out, int] = {}
        for value in self.outcome.values():
            if value is not None:
                counts[value] = counts.get(value, 0) + 1
        assert self.store.count_outcomes("c1") == counts


TestOutcomeRules = OutcomeRules.TestCase
TestOutcomeRules.settings = settings(
    max_examples=60, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
