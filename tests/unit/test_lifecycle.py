"""Task and campaign lifecycles: random sequences of attempted transitions against the tables."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sendqueue.domain.errors import DomainError, IllegalTransition
from sendqueue.domain.lifecycle import (
    CAMPAIGN_TRANSITIONS,
    TASK_TRANSITIONS,
    CampaignState,
    TaskState,
    check_campaign_transition,
    check_task_transition,
)

T = TaskState
C = CampaignState

# The design's table, written out again so the code's table is checked against it.
DESIGN_TASK_EDGES = {
    (T.PENDING, T.RUNNING),
    (T.RUNNING, T.FINISHED),
    (T.RUNNING, T.FAILED),
    (T.RUNNING, T.PENDING),
    (T.PENDING, T.CANCELLED),
    (T.FAILED, T.PENDING),
}
DESIGN_CAMPAIGN_EDGES = {
    (C.DRAFT, C.PROVISIONING),
    (C.PROVISIONING, C.ACTIVE),
    (C.ACTIVE, C.COMPLETED),
    (C.ACTIVE, C.PAUSED),
    (C.PAUSED, C.ACTIVE),
    (C.COMPLETED, C.ACTIVE),
    *((s, C.CANCELLED) for s in (C.DRAFT, C.PROVISIONING, C.ACTIVE, C.PAUSED)),
}


def try_task(state: TaskState, target: TaskState) -> tuple[TaskState, bool]:
    """Apply the transition as a store would: on refusal the state stays."""
    try:
        check_task_transition(state, target)
    except IllegalTransition:
        return state, False
    return target, True


def try_campaign(state: CampaignState, target: CampaignState) -> tuple[CampaignState, bool]:
    try:
        check_campaign_transition(state, target)
    except IllegalTransition:
        return state, False
    return target, True


def test_tables_are_the_designs() -> None:
    assert set(TASK_TRANSITIONS) == DESIGN_TASK_EDGES
    assert set(CAMPAIGN_TRANSITIONS) == DESIGN_CAMPAIGN_EDGES
    assert all(TASK_TRANSITIONS.values())
    assert all(CAMPAIGN_TRANSITIONS.values())


@pytest.mark.parametrize(("current", "target"), list(itertools.product(TaskState, repeat=2)))
def test_task_check_agrees_with_the_table(current: TaskState, target: TaskState) -> None:
    if (current, target) in TASK_TRANSITIONS:
        check_task_transition(current, target)
    else:
        with pytest.raises(IllegalTransition) as err:
            check_task_transition(current, target)
        assert isinstance(err.value, DomainError)
        assert err.value.kind == "task"
        assert err.value.current == current.value
        assert err.value.target == target.value
        assert f"from {current.value} to {target.value}" in str(err.value)


@pytest.mark.parametrize(("current", "target"), list(itertools.product(CampaignState, repeat=2)))
def test_campaign_check_agrees_with_the_table(
    current: CampaignState, target: CampaignState
) -> None:
    if (current, target) in CAMPAIGN_TRANSITIONS:
        check_campaign_transition(current, target)
    else:
        with pytest.raises(IllegalTransition) as err:
            check_campaign_transition(current, target)
        assert err.value.kind == "campaign"
        assert err.value.current == current.value
        assert err.value.target == target.value


@settings(max_examples=300, deadline=None)
@given(
    start=st.sampled_from(TaskState),
    attempts=st.lists(st.sampled_from(TaskState), max_size=40),
)
def test_random_task_histories(start: TaskState, attempts: list[TaskState]) -> None:
    state = start
    for target in attempts:
        new, applied = try_task(state, target)
        assert applied == ((state, target) in TASK_TRANSITIONS)
        assert new is (target if applied else state)
        if applied:
            # Finished and Cancelled never change; Failed only goes back to Pending
            assert state not in (T.FINISHED, T.CANCELLED)
            if state is T.FAILED:
                assert new is T.PENDING
            # nothing skips the claim: Finished and Failed only come from Running
            if new in (T.FINISHED, T.FAILED):
                assert state is T.RUNNING
        state = new
    if start in (T.FINISHED, T.CANCELLED):
        assert state is start


@settings(max_examples=300, deadline=None)
@given(
    start=st.sampled_from(CampaignState),
    attempts=st.lists(st.sampled_from(CampaignState), max_size=40),
)
def test_random_campaign_histories(start: CampaignState, attempts: list[CampaignState]) -> None:
    state = start
    seen_cancelled = start is C.CANCELLED
    for target in attempts:
        new, applied = try_campaign(state, target)
        assert applied == ((state, target) in CAMPAIGN_TRANSITIONS)
        assert new is (target if applied else state)
        if seen_cancelled:
            assert not applied
            assert new is C.CANCELLED
        if applied:
            # a draft is provisioned or cancelled; completed can only be re-activated
            if state is C.DRAFT:
                assert new in (C.PROVISIONING, C.CANCELLED)
            if state is C.COMPLETED:
                assert new is C.ACTIVE
            if new is C.PAUSED:
                assert state is C.ACTIVE
            if new is C.COMPLETED:
                assert state is C.ACTIVE
        seen_cancelled = seen_cancelled or new is C.CANCELLED
        state = new


def test_final_states() -> None:
    assert {s for s in TaskState if s.is_final} == {T.FINISHED, T.FAILED, T.CANCELLED}
    assert {s for s in CampaignState if s.is_final} == {C.CANCELLED}
    # no final task state leads anywhere except Failed -> Pending (retry-failed)
    leaving_final = {(a, b) for a, b in TASK_TRANSITIONS if a.is_final}
    assert leaving_final == {(T.FAILED, T.PENDING)}
    assert not [b for a, b in CAMPAIGN_TRANSITIONS if a.is_final]


def test_state_values_are_what_the_cli_prints() -> None:
    assert [s.value for s in TaskState] == ["Pending", "Running", "Finished", "Failed", "Cancelled"]
    assert [s.value for s in CampaignState] == [
        "draft",
        "provisioning",
        "active",
        "paused",
        "completed",
        "cancelled",
    ]
    assert TaskState("Running") is T.RUNNING
    assert str(C.ACTIVE) == "active"
