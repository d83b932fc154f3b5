"""sendqueue.ops.migrate_to checks its target itself, and carries the counters, the
suppression list and the feedback loop's state over."""

from __future__ import annotations

from pathlib import Path

import pytest

from sendqueue.adapters.sql import open_store
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.lifecycle import StopOnReply, TaskOutcome, TaskState
from sendqueue.domain.suppression import Suppression, SuppressionReason
from sendqueue.ops.migrate_to import migrate_to
from sendqueue.services.scheduling.schedules import ScheduleWriter
from sendqueue.testing import FakeClock, FakeScheduler, InMemoryTaskStore
from tests.contract.store_backends import campaign, make_task, recipients
from tests.support.app import T0


def test_migrate_to_refuses_a_target_that_is_not_a_sql_store(tmp_path: Path) -> None:
    clock = FakeClock()
    writer = ScheduleWriter(FakeScheduler(clock), lambda _cid: "UTC")
    with pytest.raises(InvalidField, match="PostgreSQL"):
        migrate_to(f"sqlite:///{tmp_path / 'store.db'}", InMemoryTaskStore(), writer, clock)


@pytest.mark.postgres
def test_migrate_to_keeps_the_session_generation(tmp_path: Path, postgres_url: str) -> None:
    # A logout on the old store must not be undone by the move: the old cookies stay refused.
    source_url = f"sqlite:///{tmp_path / 'store.db'}"
    with open_store(source_url) as source:
        source.increment_counter("session-generation")
        source.increment_counter("session-generation")
    clock = FakeClock()
    writer = ScheduleWriter(FakeScheduler(clock), lambda _cid: "UTC")
    with open_store(postgres_url) as target:
        target.increment_counter("session-generation")  # a lower value there loses
        migrate_to(source_url, target, writer, clock)
        assert target.counter("session-generation") == 2


@pytest.mark.postgres
def test_migrate_to_carries_the_suppression_list_over(tmp_path: Path, postgres_url: str) -> None:
    # A move must never make a suppressed address sendable again.
    source_url = f"sqlite:///{tmp_path / 'store.db'}"
    listed = [
        Suppression(f"s{i}@example.com", SuppressionReason.BOUNCED, f"c1-{i}", T0) for i in range(7)
    ]
    with open_store(source_url) as source:
        assert source.suppress(listed) == 7
    clock = FakeClock()
    writer = ScheduleWriter(FakeScheduler(clock), lambda _cid: "UTC")
    with open_store(postgres_url) as target:
        kept = Suppression("s0@example.com", SuppressionReason.MANUAL, None, T0)
        assert target.suppress([kept]) == 1  # listed there already: it keeps its own entry
        report = migrate_to(source_url, target, writer, clock, batch=3)
        assert report.suppressions == 6
        assert target.list_suppressions(limit=100) == [kept, *listed[1:]]


@pytest.mark.postgres
def test_migrate_to_carries_outcomes_options_soft_bounces_and_mailbox_positions(
    tmp_path: Path, postgres_url: str
) -> None:
    # After the move, the feedback loop goes on where it was: outcomes and campaign options
    # kept, the address index filled, no bounce counted twice, no mailbox read again.
    source_url = f"sqlite:///{tmp_path / 'store.db'}"
    old, new = "imap://bounces@mail.example.com:993/INBOX", "imap://replies@mail.example.com/INBOX"
    with open_store(source_url) as source:
        source.create_campaign(
            campaign("c1", stop_on_reply=StopOnReply.CAMPAIGN, unsubscribe_footer=True),
            recipients(2),
        )
        source.insert_tasks([make_task("c1", 0, email="Straße@Example.com")], at=T0)
        assert source.transition("c1-0", TaskState.PENDING, TaskState.RUNNING, at=T0)
        assert source.transition(
            "c1-0",
            TaskState.RUNNING,
            TaskState.FINISHED,
            at=T0,
            changes={"sent_at": T0, "outcome": TaskOutcome.ACCEPTED, "outcome_at": T0},
        )
        assert source.set_outcome("c1-0", TaskOutcome.BOUNCED, detail="5.1.1", at=T0)
        for key in ("m:1:1", "m:1:2"):
            source.record_soft_bounce("a@example.com", key, at=T0, since=T0)
        source.save_feedback_cursor(old, 7, 120)
        source.save_feedback_cursor(new, 3, 40)
        sent = source.get_task("c1-0")
    clock = FakeClock()
    writer = ScheduleWriter(FakeScheduler(clock), lambda _cid: "UTC")
    with open_store(postgres_url) as target:
        target.record_soft_bounce("a@example.com", "m:1:2", at=T0, since=T0)  # counted there
        target.save_feedback_cursor(old, 7, 100)  # behind: moved forward
        target.save_feedback_cursor(new, 4, 2)  # rebuilt mailbox: the target's own stays
        report = migrate_to(source_url, target, writer, clock, batch=1)
        assert (report.soft_bounces, report.feedback_cursors) == (1, 1)
        assert target.get_task("c1-0") == sent
        assert sent is not None and sent.outcome is TaskOutcome.BOUNCED
        got = target.get_campaign("c1")
        assert (got.stop_on_reply, got.unsubscribe_footer) == (StopOnReply.CAMPAIGN, True)
        assert target.tasks_for("strasse@example.com", states=[TaskState.FINISHED]) == [sent]
        assert target.count_outcomes("c1") == {TaskOutcome.BOUNCED: 1}
        assert target.record_soft_bounce("a@example.com", "m:1:3", at=T0, since=T0) == 3
        assert target.feedback_cursor(old) == (7, 120)
        assert target.feedback_cursor(new) == (4, 2)
