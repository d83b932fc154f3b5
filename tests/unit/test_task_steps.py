"""A task's sequence step in the domain: its id, the schedule names derived from it, and the
check every store runs on new tasks."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from sendqueue.adapters import scheduler_rules as rules
from sendqueue.domain.errors import IllegalTransition, InvalidField
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import (
    MAX_STEP,
    Task,
    check_new_tasks,
    new_campaign_id,
    pending_task,
    schedule_name,
    task_id,
)

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


def _task(step: int = 1) -> Task:
    return pending_task(
        task_id("c1", 5, step), "c1", 5, "a@example.com", "", "s", "t", None, T0, "tok", T0,
        step=step,
    )  # fmt: skip


def test_step_one_keeps_the_ids_tasks_had_before_sequences() -> None:
    assert task_id("c0123456789ab", 7) == task_id("c0123456789ab", 7, 1) == "c0123456789ab-7"
    assert Task("c1-0", "c1", 0, "a@example.com", "", "s", "t", None, T0, "tok").step == 1
    assert _task().step == 1


def test_each_later_step_has_its_own_deterministic_id() -> None:
    ids = [task_id("c1", 5, step) for step in range(1, MAX_STEP + 1)]
    assert ids[:3] == ["c1-5", "c1-5-s2", "c1-5-s3"]
    assert len(set(ids)) == MAX_STEP
    assert ids == [task_id("c1", 5, step) for step in range(1, MAX_STEP + 1)]
    # Never one of another recipient's ids: positions are digits only.
    assert not {task_id("c1", p, s) for p in (5, 52, 53) for s in (2, 3)} & set(ids[:1])


@pytest.mark.parametrize("step", [0, -1, MAX_STEP + 1, 2.0, "2"])
def test_a_step_outside_one_to_ten_is_refused_naming_the_field(step: object) -> None:
    with pytest.raises(InvalidField) as info:
        task_id("c1", 5, step)  # type: ignore[arg-type]
    assert info.value.field == "step"
    with pytest.raises(InvalidField) as info:
        check_new_tasks([_task(), replace(_task(), step=step)])  # type: ignore[arg-type]
    assert info.value.field == "step"


def test_new_tasks_of_every_step_pass_the_check_and_the_state_rule_still_holds() -> None:
    check_new_tasks([_task(step) for step in range(1, MAX_STEP + 1)])
    with pytest.raises(IllegalTransition):
        check_new_tasks([replace(_task(3), state=TaskState.RUNNING)])


def test_the_longest_schedule_name_fits_every_execution_layer() -> None:
    longest = task_id(new_campaign_id(), 999_999_999, MAX_STEP)
    for attempt in (0, 9, 10**6):
        name = schedule_name(longest, attempt)
        assert rules.check_name(name) == name
        assert len(name) <= 40
