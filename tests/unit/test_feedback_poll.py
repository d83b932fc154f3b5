"""The feedback poll service on in-memory parts: counts per kind, the cursor saved per batch,
a pass that dies half-way, a new UIDVALIDITY, the lease per mailbox, a mailbox that is down,
and the wiring (settings -> sources, the real parser by default)."""

from __future__ import annotations

import logging
from collections.abc import Collection
from datetime import datetime
from typing import Any, cast

import pytest

from sendqueue.adapters.parser import IsolatedParser
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.errors import FeedbackUnavailable, StoreUnavailable
from sendqueue.domain.feedback import Feedback, FeedbackKind
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import expected_schedule_name, schedule_group
from sendqueue.domain.reports import parse_feedback
from sendqueue.ports import FeedbackSource
from sendqueue.services.feedback.poll import FeedbackParser, lease_name
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailbox import InMemoryMailbox
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.app import LENIENT_LATENESS, T0, csv_bytes, open_policy

_KINDS = {
    b"hard": FeedbackKind.HARD_BOUNCE,
    b"soft": FeedbackKind.SOFT_BOUNCE,
    b"complaint": FeedbackKind.COMPLAINT,
    b"reply": FeedbackKind.REPLY,
}


def _parse(
    raw: bytes,
    *,
    received_at: datetime,
    key: str | None = None,
    bounce_address: str | None = None,
    secret: str | None = None,
    trusted_authserv: Collection[str] = (),
) -> list[Feedback]:
    """A parser for the tests' one-line messages: ``b"hard <task id>"``; ``b"boom"`` raises."""
    if raw == b"boom":
        raise ValueError("unparseable")
    kind, _, task_id = raw.partition(b" ")
    if kind not in _KINDS:
        return []
    return [Feedback(_KINDS[kind], received_at, task_id=task_id.decode(), key=key)]


def _app(
    *sources: FeedbackSource,
    parse: FeedbackParser | None = _parse,
    store: InMemoryTaskStore | None = None,
    **settings: Any,
) -> Container:
    clock = FakeClock(T0)
    values: dict[str, Any] = {
        "_env_file": None,
        "max_lateness": LENIENT_LATENESS,
        "space_late_sends": False,
    }
    values.update(settings)
    return bootstrap(
        Settings(**values),
        clock=clock,
        store=store or InMemoryTaskStore(),
        scheduler=FakeScheduler(clock, seed=1),
        mailer=RecordingMailer(),
        feedback_sources=list(sources),
        parse_feedback=parse,
    )


def _sent(app: Container, count: int) -> str:
    """A campaign of ``count`` whose emails were all sent."""
    cid = app.campaign_import.create(
        name="p", recipients=csv_bytes(count), policy=open_policy(), from_addr="n@example.com"
    ).campaign.id
    app.provisioner.provision(cid)
    clock = app.clock
    assert isinstance(clock, FakeClock)
    clock.advance(days=1)
    scheduler = app.scheduler
    assert isinstance(scheduler, FakeScheduler)
    scheduler.fire_due(app.invoke)
    return cid


def test_a_pass_applies_each_kind_and_counts_what_it_read() -> None:
    box = InMemoryMailbox()
    app = _app(box)
    cid = _sent(app, 4)
    for raw in (b"hard", b"soft", b"complaint", b"reply"):
        box.add(raw + f" {cid}-{list(_KINDS).index(raw)}".encode())
    box.add(b"a newsletter")
    box.add(b"boom")  # a parser failure: skipped with one log line, the pass goes on
    box.add(b"hard c0000000000ff-3")  # about nothing sendqueue sent
    report = app.feedback_poller.poll()
    assert report.as_dict() == {
        "mailboxes": 1,
        "messages": 7,
        "bounces": 1,
        "soft_bounces": 1,
        "complaints": 1,
        "replies": 1,
        "unsubscribes": 0,
        "auto_replies": 0,
        "not_feedback": 1,
        "ignored": 1,
        "unverified": 0,
        "skipped": 1,
        "busy": [],
        "errors": [],
    }
    outcomes = [t.outcome for t in app.store.list_tasks(cid)]
    assert outcomes == [
        TaskOutcome.BOUNCED,
        TaskOutcome.ACCEPTED,
        TaskOutcome.COMPLAINED,
        TaskOutcome.REPLIED,
    ]
    store = app.store
    assert isinstance(store, InMemoryTaskStore)
    assert store.feedback_cursor(box.name) == (1, 7)
    assert box.closed == 1  # no connection kept between passes
    assert app.feedback_poller.poll().messages == 0


def test_the_cursor_is_saved_per_batch_so_a_dead_pass_resumes_after_the_last_saved_one() -> None:
    box = InMemoryMailbox()
    store = InMemoryTaskStore()
    seen: list[bytes] = []

    def store_dies_at_the_fourth(raw: bytes, *, received_at: datetime, **kw: Any) -> list[Feedback]:
        seen.append(raw)
        if len(seen) == 4:
            store.set_available(False)  # applying this one fails
            return [Feedback(FeedbackKind.HARD_BOUNCE, received_at, recipient="a@example.com")]
        return []

    for n in range(5):
        box.add(f"m{n}".encode())
    app = _app(box, parse=store_dies_at_the_fourth, store=store)
    app.feedback_poller._batch = 2
    with pytest.raises(StoreUnavailable):
        app.feedback_poller.poll()
    store.set_available(True)
    assert store.feedback_cursor(box.name) == (1, 2)  # the batch m2, m3 was not finished
    # the next pass goes on from the saved cursor: m2 and m3 again, then m4
    report = app.feedback_poller.poll()
    assert (report.messages, report.not_feedback) == (3, 3)
    assert seen[4:] == [b"m2", b"m3", b"m4"]
    assert store.feedback_cursor(box.name) == (1, 5)


def test_a_new_uidvalidity_reads_the_mailbox_again_with_no_effect_twice() -> None:
    box = InMemoryMailbox()
    app = _app(box)
    cid = _sent(app, 2)
    box.add(f"hard {cid}-0".encode())
    box.add(b"newsletter")
    assert app.feedback_poller.poll().bounces == 1
    box.recreate()
    box.add(b"another newsletter")
    report = app.feedback_poller.poll()
    assert (report.messages, report.bounces, report.not_feedback) == (3, 1, 2)
    store = app.store
    assert isinstance(store, InMemoryTaskStore)
    assert store.feedback_cursor(box.name) == (2, 3)
    notes = [e.note for e in store.changes_after(0, campaign_id=cid) if e.task_id == f"{cid}-0"]
    assert notes.count("outcome: bounced") == 1
    assert len(store.list_suppressions()) == 1


def test_an_empty_mailbox_of_a_new_uidvalidity_moves_the_cursor_to_it() -> None:
    box = InMemoryMailbox()
    app = _app(box)
    assert app.feedback_poller.poll().messages == 0
    store = app.store
    assert isinstance(store, InMemoryTaskStore)
    assert store.feedback_cursor(box.name) == (1, 0)


def test_a_mailbox_another_poller_reads_is_skipped_this_pass() -> None:
    box = InMemoryMailbox()
    box.add(b"newsletter")
    app = _app(box)
    store = app.store
    assert store.acquire_lease(lease_name(box.name), "other", ttl_seconds=300, at=T0)
    report = app.feedback_poller.poll()
    assert (report.busy, report.messages, box.fetches) == ([box.name], 0, 0)
    store.release_lease(lease_name(box.name), "other")
    assert app.feedback_poller.poll().messages == 1


def test_a_mailbox_that_is_down_is_an_error_and_the_others_are_still_read() -> None:
    down = InMemoryMailbox("imap://bounces@down.test:143/INBOX")
    down.available = False
    up = InMemoryMailbox("imap://replies@up.test:143/INBOX")
    up.add(b"newsletter")
    app = _app(down, up)
    report = app.feedback_poller.poll()
    assert report.errors == [f"{down.name}: {down.name}: connecting failed: simulated outage"]
    assert (report.mailboxes, report.messages) == (2, 1)
    assert down.closed == 1


def test_the_settings_build_the_imap_source_and_the_real_parser() -> None:
    app = _app(parse=None)
    assert app.feedback_poller.poll().mailboxes == 0  # no feedback mailbox, no sender's
    url = "imaps://bounces:pa%3Ass@mail.example.com/Bounces"
    app = bootstrap(
        Settings(_env_file=None, feedback_imap=url, secret_key="k" * 8 + "0123456789abcdef" * 2),
        store=InMemoryTaskStore(),
        mailer=RecordingMailer(),
    )
    (source,) = app.feedback_sources
    assert source.name == "imap://bounces@mail.example.com:993/Bounces"
    assert "pa:ss" not in repr(source)
    poller = app.feedback_poller
    assert poller.configured
    box = InMemoryMailbox()
    dsn = (
        b"From: MAILER-DAEMON@mx.example\r\nTo: bounces@example.com\r\nSubject: x\r\n\r\nhello\r\n"
    )
    box.add(dsn)
    real = bootstrap(
        Settings(_env_file=None, feedback_parse_seconds=5),
        store=InMemoryTaskStore(),
        mailer=RecordingMailer(),
        feedback_sources=[box],
    )
    try:
        # the real parser, in its own process within SENDQUEUE_FEEDBACK_PARSE_SECONDS
        parser = real.feedback_poller._parse
        assert isinstance(parser, IsolatedParser)
        assert (parser.seconds, repr(parse_feedback) in repr(parser)) == (5, True)
        assert real.feedback_poller.poll().not_feedback == 1
        assert parser.pid is not None
    finally:
        real.close()
    assert parser.pid is None  # the container's close stopped it


def test_a_cancel_by_feedback_deletes_the_schedules_of_the_cancelled_tasks() -> None:
    box = InMemoryMailbox()
    app = _app(box)
    cid = _sent(app, 1)
    later = app.campaign_import.create(
        name="later",
        recipients=csv_bytes(1),
        policy=open_policy(T0.replace(year=2027)),
        from_addr="n@example.com",
    ).campaign.id
    app.provisioner.provision(later)
    pending = app.store.get_task(f"{later}-0")
    assert pending is not None
    scheduler = app.scheduler
    assert {s.name for s in scheduler.list(schedule_group(later))} == {
        expected_schedule_name(pending)
    }
    box.add(f"hard {cid}-0".encode())
    app.feedback_poller.poll()
    task = app.store.get_task(f"{later}-0")
    assert task is not None and task.state is TaskState.CANCELLED
    assert scheduler.list(schedule_group(later)) == []


def test_a_new_uidvalidity_does_not_count_the_same_transient_bounces_again() -> None:
    # Red team: two transient bounces of one address, then the mailbox is re-created (a new
    # UIDVALIDITY, the same two messages numbered anew). Still two bounces: below the limit of
    # three, the address must not be suppressed.
    box = InMemoryMailbox()
    app = _app(box)
    cid = _sent(app, 1)
    box.add(f"soft {cid}-0".encode())
    box.add(f"soft {cid}-0".encode())
    assert app.feedback_poller.poll().soft_bounces == 2
    box.recreate()
    app.feedback_poller.poll()
    store = app.store
    assert isinstance(store, InMemoryTaskStore)
    assert store.list_suppressions() == []
    [task] = store.list_tasks(cid)
    assert task.outcome is TaskOutcome.ACCEPTED


def test_each_message_is_parsed_and_applied_before_the_next_is_read() -> None:
    # Red team: a poll held its whole batch (200 messages of up to 1 MiB) at once. The source
    # hands messages over one at a time, and the poller must not gather them either.
    box = InMemoryMailbox()
    handed: list[int] = []

    def note(raw: bytes, *, received_at: datetime, **kw: Any) -> list[Feedback]:
        handed.append(box.handed)
        return []

    for n in range(5):
        box.add(f"m{n}".encode())
    app = _app(box, parse=note)
    app.feedback_poller._batch = 3
    assert app.feedback_poller.poll().messages == 5
    assert handed == [1, 2, 3, 4, 5]
    store = app.store
    assert isinstance(store, InMemoryTaskStore)
    assert store.feedback_cursor(box.name) == (1, 5)


def test_a_skipped_message_is_one_warning_line_and_the_one_behind_it_is_applied(
    caplog: pytest.LogCaptureFixture,
) -> None:
    box = InMemoryMailbox()
    app = _app(box)
    cid = _sent(app, 1)
    box.add(b"boom")
    box.add(f"reply {cid}-0".encode())
    with caplog.at_level(logging.DEBUG, logger="sendqueue"):
        report = app.feedback_poller.poll()
    assert (report.messages, report.skipped, report.replies) == (2, 1, 1)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        f"feedback message {box.name}:1:1 skipped: the parser raised ValueError: unparseable"
    ]
    assert warnings[0].exc_info is None  # the traceback only at DEBUG
    store = app.store
    assert isinstance(store, InMemoryTaskStore)
    assert store.feedback_cursor(box.name) == (1, 2)  # a skipped message is not read again
    assert app.feedback_poller.poll().messages == 0


def test_a_parser_that_cannot_run_stops_the_pass_before_its_cursor_moves() -> None:
    def cannot_start(raw: bytes, *, received_at: datetime, **kw: Any) -> list[Feedback]:
        raise FeedbackUnavailable("the feedback parser process did not start")

    box = InMemoryMailbox()
    box.add(b"m0")
    box.add(b"m1")
    app = _app(box, parse=cannot_start)
    report = app.feedback_poller.poll()
    assert report.errors == [f"{box.name}: the feedback parser process did not start"]
    assert (report.messages, report.skipped) == (1, 0)
    store = app.store
    assert isinstance(store, InMemoryTaskStore)
    assert store.feedback_cursor(box.name) is None  # nothing skipped: read again next pass


def test_a_mailbox_failing_half_way_keeps_the_cursor_of_the_last_whole_batch() -> None:
    box = InMemoryMailbox()

    def down_at_m2(raw: bytes, *, received_at: datetime, **kw: Any) -> list[Feedback]:
        if raw == b"m2":
            box.available = False  # the connection drops before the next message is read
        return []

    for n in range(5):
        box.add(f"m{n}".encode())
    app = _app(box, parse=down_at_m2)
    app.feedback_poller._batch = 2
    report = app.feedback_poller.poll()
    assert report.errors == [f"{box.name}: {box.name}: fetching failed: simulated outage"]
    assert report.messages == 3
    store = app.store
    assert isinstance(store, InMemoryTaskStore)
    assert store.feedback_cursor(box.name) == (1, 2)


def test_the_lease_is_renewed_within_a_batch_that_outlasts_half_of_it() -> None:
    # Each message takes 100 s (a parse budget of 60 s, then the writes): a batch of six
    # outlasts the 300 s lease, which another poller must not take over half-way.
    box = InMemoryMailbox()
    store = InMemoryTaskStore()
    taken: list[bool] = []

    def slow(raw: bytes, *, received_at: datetime, **kw: Any) -> list[Feedback]:
        now = clock.advance(100)
        taken.append(store.acquire_lease(lease_name(box.name), "other", ttl_seconds=300, at=now))
        return []

    for n in range(6):
        box.add(f"m{n}".encode())
    app = _app(box, parse=slow, store=store)
    clock = cast(FakeClock, app.clock)
    assert app.feedback_poller.poll().messages == 6
    assert taken == [False] * 6


def test_close_closes_a_parser_that_holds_something() -> None:
    class Holding:
        closed = 0

        def __call__(self, raw: bytes, **kwargs: Any) -> list[Feedback]:
            return []

        def close(self) -> None:
            self.closed += 1

    parser = Holding()
    box = InMemoryMailbox()
    box.add(b"m0")
    app = _app(box, parse=parser)
    assert app.feedback_poller.poll().not_feedback == 1
    assert parser.closed == 0  # kept from one pass to the next
    app.close()
    assert parser.closed == 1
