"""Named task transitions: what each one changes, and random sequences of them against a store."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sendqueue.domain import transitions
from sendqueue.domain.errors import IllegalTransition
from sendqueue.domain.lifecycle import TASK_TRANSITIONS, CampaignState, TaskOutcome, TaskState
from sendqueue.domain.models import Campaign, Move, Task
from sendqueue.domain.transitions import (
    ERROR_LIMIT,
    MOVED_REASON_LIMIT,
    TaskChange,
    cancel,
    claim,
    fail,
    finish,
    give_back,
    retry_into,
    unclaim,
)
from sendqueue.services.task_changes import apply_change
from sendqueue.testing.store import InMemoryTaskStore
from sendqueue.testing.tasks import bare_task
from tests.support.app import T0, csv_bytes, fake_app, open_policy

S = TaskState
CID = "c00000000000a"
TOKEN = re.compile(r"[0-9a-f]{32}")


def pending() -> Task:
    return bare_task(CID, 0, T0)


def running(attempts: int = 1) -> Task:
    return replace(pending(), state=S.RUNNING, attempts=attempts, claimed_at=T0)


def failed() -> Task:
    return replace(running(3), state=S.FAILED, error="permanent: 550", moves=2)


# --- each transition -------------------------------------------------------------------------


def test_claim_counts_an_attempt_and_stamps_the_claim() -> None:
    at = T0 + timedelta(seconds=5)
    change = claim(replace(pending(), attempts=2), at)
    assert change == TaskChange(
        "c00000000000a-0", S.PENDING, S.RUNNING, {"claimed_at": at, "attempts": 3}
    )
    assert change.note is None


def test_finish_records_the_send_with_an_accepted_outcome() -> None:
    sent = T0 + timedelta(seconds=7)
    change = finish(running(), sent, "<m1@example.com>")
    assert (change.expected, change.new, change.note) == (S.RUNNING, S.FINISHED, None)
    assert change.changes == {
        "sent_at": sent,
        "message_id": "<m1@example.com>",
        "error": None,
        "outcome": TaskOutcome.ACCEPTED,
        "outcome_at": sent,
    }


def test_fail_keeps_the_error_cut_and_notes_it() -> None:
    change = fail(running(), "permanent: 550 no such user")
    assert (change.expected, change.new) == (S.RUNNING, S.FAILED)
    assert change.changes == {"error": "permanent: 550 no such user"}
    assert change.note == "permanent: 550 no such user"
    long = fail(running(), "x" * (ERROR_LIMIT + 50))
    assert long.changes == {"error": "x" * ERROR_LIMIT}
    assert long.note == "x" * ERROR_LIMIT
    stale = fail(running(), "outcome unknown", note="stale: outcome unknown")
    assert (stale.changes, stale.note) == ({"error": "outcome unknown"}, "stale: outcome unknown")


def test_give_back_returns_the_task_with_or_without_its_attempt_and_no_claim() -> None:
    kept = give_back(running(2), "campaign not active")
    assert (kept.expected, kept.new, kept.changes, kept.note) == (
        S.RUNNING,
        S.PENDING,
        {"claimed_at": None},
        "campaign not active",
    )
    undone = give_back(running(2), "its sender's slot was taken", undo_attempt=True)
    assert undone.changes == {"attempts": 1, "claimed_at": None}
    assert undone.note == "its sender's slot was taken"


def test_unclaim_restores_the_task_as_read_before_its_claim_with_no_claim() -> None:
    before = replace(pending(), attempts=1, claimed_at=T0 - timedelta(hours=1))
    change = unclaim(before, "moved before its claim")
    assert (change.expected, change.new, change.note) == (
        S.RUNNING,
        S.PENDING,
        "moved before its claim",
    )
    assert change.changes == {"attempts": 1, "claimed_at": None}  # not the stale one read


def test_cancel_with_a_reason_keeps_it_and_notes_it() -> None:
    plain = cancel(pending(), note="cancelled by the user")
    assert (plain.expected, plain.new, plain.changes, plain.note) == (
        S.PENDING,
        S.CANCELLED,
        {},
        "cancelled by the user",
    )
    suppressed = cancel(pending(), reason="suppressed: bounced")
    assert (suppressed.changes, suppressed.note) == (
        {"reason": "suppressed: bounced"},
        "suppressed: bounced",
    )
    both = cancel(pending(), reason="replied", note="a reply came")
    assert (both.changes, both.note) == ({"reason": "replied"}, "a reply came")


def test_retry_into_from_running_moves_the_task_keeps_its_attempts_drops_its_claim() -> None:
    task = replace(running(2), moves=4)
    slot = T0 + timedelta(minutes=30)
    change = retry_into(
        task, slot, reason="transient: 421", error="transient: 421", note="retry 3 of 5 in 60s"
    )
    assert (change.expected, change.new, change.note) == (
        S.RUNNING,
        S.PENDING,
        "retry 3 of 5 in 60s",
    )
    token = change.changes["token"]
    assert TOKEN.fullmatch(token) and token != task.token
    assert change.changes == {
        "send_at": slot,
        "token": token,
        "error": "transient: 421",
        "moves": 5,
        "moved_reason": "transient: 421",
        "claimed_at": None,
    }


def test_retry_into_from_failed_starts_afresh() -> None:
    slot = T0 + timedelta(hours=2)
    change = retry_into(failed(), slot, reason="retry-failed", note="retry-failed", token="t2")
    assert (change.expected, change.new, change.note) == (S.FAILED, S.PENDING, "retry-failed")
    assert change.changes == {
        "send_at": slot,
        "token": "t2",
        "error": None,
        "moves": 3,
        "moved_reason": "retry-failed",
        "attempts": 0,
        "claimed_at": None,
    }


def test_retry_into_cuts_its_texts_and_draws_a_new_token_each_time() -> None:
    error = "transient: " + "y" * 3000
    first = retry_into(running(), T0, reason=error, error=error, note="retry")
    second = retry_into(running(), T0, reason=error, error=error, note="retry")
    assert first.changes["error"] == error[:ERROR_LIMIT]
    assert first.changes["moved_reason"] == error[:MOVED_REASON_LIMIT]
    assert first.changes["token"] != second.changes["token"]


@pytest.mark.parametrize("state", [S.PENDING, S.FINISHED, S.CANCELLED])
def test_retry_into_refuses_a_task_neither_running_nor_failed(state: TaskState) -> None:
    with pytest.raises(IllegalTransition, match=f"from {state.value} to Pending"):
        retry_into(replace(pending(), state=state), T0, reason="r", note="n")


def test_move_keeps_the_old_token_to_compare_and_draws_a_new_one() -> None:
    slot = T0 + timedelta(minutes=3)
    step = transitions.move(pending(), slot)
    assert isinstance(step, Move)
    assert (step.task_id, step.token, step.send_at) == ("c00000000000a-0", "tok0", slot)
    assert TOKEN.fullmatch(step.new_token)
    assert transitions.move(pending(), slot, token="t9").new_token == "t9"


@pytest.mark.parametrize(("expected", "new"), [(S.FINISHED, S.PENDING), (S.PENDING, S.FINISHED)])
def test_a_change_outside_the_lifecycle_cannot_be_made(expected: TaskState, new: TaskState) -> None:
    with pytest.raises(IllegalTransition):
        TaskChange("c00000000000a-0", expected, new)


def test_a_change_is_frozen() -> None:
    change = claim(pending(), T0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        change.new = S.FINISHED  # type: ignore[misc]


# --- applied by a store ----------------------------------------------------------------------


def store_with_one_task() -> InMemoryTaskStore:
    store = InMemoryTaskStore()
    campaign = Campaign(
        id=CID, name=CID, policy=open_policy(), from_addr="a@example.com",
        state=CampaignState.ACTIVE,
    )  # fmt: skip
    store.create_campaign(campaign, [])
    store.insert_tasks([pending()], at=T0)
    return store


def test_apply_change_is_the_stores_compare_and_set_with_the_note() -> None:
    store = store_with_one_task()
    at = T0 + timedelta(seconds=1)
    claimed = apply_change(store, claim(pending(), at), at=at)
    assert claimed is not None
    assert (claimed.state, claimed.attempts, claimed.claimed_at) == (S.RUNNING, 1, at)
    # computed from a stale read (Pending): the store's state is Running, nothing applies
    before = store.last_change_id()
    assert apply_change(store, cancel(pending(), reason="suppressed: bounced"), at=at) is None
    assert store.last_change_id() == before
    done = apply_change(store, fail(claimed, "permanent: 550"), at=at)
    assert done is not None
    assert (done.state, done.error) == (S.FAILED, "permanent: 550")
    [entry] = store.changes_after(before)
    assert (entry.from_state, entry.to_state, entry.note) == ("Running", "Failed", "permanent: 550")


# --- random sequences against a store --------------------------------------------------------


class TransitionRules(RuleBasedStateMachine):
    """Named transitions in random order, each computed from the task as the store has it now
    (or, for a move, maybe from an older read) and applied by the store's compare-and-set.

    After each step: only lifecycle moves were logged; Finished and Cancelled never change and
    Failed only goes back to Pending by a retry; attempts change only by a claim (+1), the undo
    of a claim (back to before it) or a retry of a Failed task (0); moves grow by exactly one
    with each retry or move, and each of those gives the task a token it never had; a Pending
    task holds no claimed_at."""

    @initialize()
    def start(self) -> None:
        self.store = store_with_one_task()
        self.minute = 0
        self.before_claim: Task | None = None
        self.reads: list[Task] = [self.task()]
        self.tokens = {self.task().token}
        self.logged = self.store.last_change_id()

    def task(self) -> Task:
        task = self.store.get_task(f"{CID}-0")
        assert task is not None
        return task

    def at(self) -> datetime:
        self.minute += 1
        return T0 + timedelta(minutes=self.minute)

    def apply(self, change: TaskChange) -> tuple[Task, Task | None]:
        before = self.task()
        got = apply_change(self.store, change, at=self.at())
        assert (got is not None) == (change.expected is before.state)
        assert (change.expected, change.new) in TASK_TRANSITIONS
        if got is not None:
            assert got == self.task()
            assert got.state is change.new
            if before.state is S.FAILED:
                assert change.new is S.PENDING and "token" in change.changes  # a retry
        else:
            assert self.task() == before  # a refused change changes nothing
        self.reads.append(self.task())
        return before, got

    @rule()
    def claim_it(self) -> None:
        read = self.task()
        before, got = self.apply(claim(read, self.at()))
        if got is not None:
            self.before_claim = before
            assert got.attempts == before.attempts + 1
            assert got.moves == before.moves

    @rule()
    def finish_it(self) -> None:
        before, got = self.apply(finish(self.task(), self.at(), "<m@example.com>"))
        if got is not None:
            assert (got.attempts, got.moves, got.outcome) == (
                before.attempts,
                before.moves,
                TaskOutcome.ACCEPTED,
            )

    @rule(error=st.text(max_size=5))
    def fail_it(self, error: str) -> None:
        before, got = self.apply(fail(self.task(), error))
        if got is not None:
            assert (got.attempts, got.moves, got.error) == (before.attempts, before.moves, error)

    @rule(undo=st.booleans())
    def give_back_it(self, undo: bool) -> None:
        before, got = self.apply(give_back(self.task(), "given back", undo_attempt=undo))
        if got is not None:
            assert self.before_claim is not None
            wanted = self.before_claim.attempts if undo else before.attempts
            assert (got.attempts, got.moves) == (wanted, before.moves)

    @precondition(lambda self: self.before_claim is not None)
    @rule()
    def unclaim_it(self) -> None:
        assert self.before_claim is not None
        before, got = self.apply(unclaim(self.before_claim, "moved before its claim"))
        if got is not None:
            assert (got.attempts, got.claimed_at) == (self.before_claim.attempts, None)
            assert got.moves == before.moves

    @rule(reason=st.none() | st.just("suppressed: bounced"))
    def cancel_it(self, reason: str | None) -> None:
        before, got = self.apply(cancel(self.task(), reason=reason, note="cancelled"))
        if got is not None:
            assert (got.attempts, got.moves) == (before.attempts, before.moves)

    @rule(minutes=st.integers(0, 600))
    def retry_it(self, minutes: int) -> None:
        read = self.task()
        slot = T0 + timedelta(minutes=minutes)
        if read.state not in (S.RUNNING, S.FAILED):
            with pytest.raises(IllegalTransition):
                retry_into(read, slot, reason="r", note="n")
            return
        before, got = self.apply(retry_into(read, slot, reason="r", error="e", note="retry"))
        assert got is not None  # computed from the current task: always applies
        assert got.moves == before.moves + 1
        assert got.attempts == (0 if before.state is S.FAILED else before.attempts)
        assert got.token not in self.tokens
        self.tokens.add(got.token)

    @rule(minutes=st.integers(0, 600), read=st.integers(0, 1000))
    def move_it(self, minutes: int, read: int) -> None:
        """Moved as a re-plan does, from a read that may be out of date."""
        seen = self.reads[read % len(self.reads)]
        before = self.task()
        step = transitions.move(seen, T0 + timedelta(minutes=minutes))
        moved = self.store.reschedule([step], at=self.at(), reason="outage")
        after = self.task()
        assert moved == (before.state is S.PENDING and before.token == seen.token)
        if moved:
            assert (after.state, after.moves, after.attempts) == (
                S.PENDING,
                before.moves + 1,
                before.attempts,
            )
            assert after.token not in self.tokens
            self.tokens.add(after.token)
        else:
            assert after == before
        self.reads.append(after)

    @invariant()
    def only_lifecycle_moves_were_logged(self) -> None:
        for entry in self.store.changes_after(self.logged):
            pair = (entry.from_state, entry.to_state)
            if pair == ("Pending", "Pending"):
                assert (entry.note or "").startswith("moved: ")
            else:
                assert (S(entry.from_state or ""), S(entry.to_state)) in TASK_TRANSITIONS
            self.logged = entry.id

    @invariant()
    def final_states_stay(self) -> None:
        states = [t.state for t in self.reads]
        for i, state in enumerate(states):
            if state in (S.FINISHED, S.CANCELLED):
                assert set(states[i:]) == {state}
        assert all(t.attempts >= 0 for t in self.reads)
        assert [t.moves for t in self.reads] == sorted(t.moves for t in self.reads)

    @invariant()
    def a_pending_task_holds_no_claim(self) -> None:
        """Only a Running task (or one it ended) keeps its claimed_at: give-backs, undone
        claims and retries leave a Pending task with none."""
        assert all(t.claimed_at is None for t in self.reads if t.state is S.PENDING)


TestTransitionRules = TransitionRules.TestCase
TestTransitionRules.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip


# --- the services' one retry into a free slot ------------------------------------------------


def test_retry_in_free_slots_applies_each_retry_in_its_own_free_slot() -> None:
    app = fake_app()
    cid = app.campaign_import.create(
        name="c", recipients=csv_bytes(6), policy=open_policy()
    ).campaign.id
    app.provisioner.provision(cid)
    campaign = app.store.get_campaign(cid)
    first, second, third = (app.store.get_task(f"{cid}-{i}") for i in range(3))
    assert first is not None and second is not None and third is not None
    claimed = [apply_change(app.store, claim(t, T0), at=T0) for t in (first, second, third)]
    assert all(t is not None for t in claimed)
    left_alone = f"{cid}-1"
    not_before = T0 + timedelta(hours=1)
    back = app.replanner.retry_in_free_slots(
        campaign,
        [t for t in claimed if t is not None],
        lambda task, slot: (
            None
            if task.id == left_alone
            else retry_into(task, slot, reason="transient: 421", error="421", note="retry")
        ),
        not_before=not_before,
        at=T0,
    )
    assert [t is None for t in back] == [False, True, False]
    retried = [t for t in back if t is not None]
    assert all(t.state is S.PENDING and t.moves == 1 and t.attempts == 1 for t in retried)
    assert all(t.send_at >= not_before for t in retried)
    pending_at = {t.send_at for t in app.store.list_tasks(cid, state=S.PENDING)}
    assert len(pending_at) == 5  # each retry took a slot of its own, no other send's
    still = app.store.get_task(left_alone)
    assert still is not None and still.state is S.RUNNING
