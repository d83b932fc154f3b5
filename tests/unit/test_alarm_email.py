"""The alarm email (SENDQUEUE_ALARM_EMAIL) on a fake clock: one email at once, then at most one
per interval across processes sharing a store, a digest of what was held back, nothing lost
when a send fails or the process stops."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from sendqueue.adapters.alarm import LoggingAlarm
from sendqueue.adapters.alarm_mail import LEASE, MailAlarm
from sendqueue.domain.alarms import AutoPause, Digest, auto_pause_reason, is_auto_paused
from sendqueue.domain.errors import PermanentMailError, TransientMailError
from sendqueue.domain.lifecycle import CampaignState
from sendqueue.domain.models import DeadLetter
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock, SystemClock
from sendqueue.testing.events import RecordingEvents
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.app import T0, csv_bytes, fake_app, open_policy

OPS = "ops@example.com"
SENDER = "alarms@example.com"

LETTER = DeadLetter(
    id="dl-1",
    schedule_name="sq-c1-7",
    group="c1",
    payload={"task_id": "c1-7"},
    error="StoreUnavailable: database is locked",
    attempts=3,
    failed_at=T0,
)


def letter(n: int) -> DeadLetter:
    return replace(LETTER, id=f"dl-{n}", schedule_name=f"sq-c1-{n}", payload={"task_id": f"c1-{n}"})


def pause(cid: str = "c9") -> AutoPause:
    return AutoPause(cid, "Winter sale", auto_pause_reason(5, "550 rejected"), T0)


def mail_alarm(
    clock: FakeClock,
    store: InMemoryTaskStore | None = None,
    mailer: RecordingMailer | None = None,
    **kw: float,
) -> tuple[MailAlarm, RecordingMailer]:
    mailer = mailer or RecordingMailer()
    alarm = MailAlarm(
        mailer,
        store or InMemoryTaskStore(),
        clock,
        to_addr=OPS,
        from_addr=SENDER,
        background=False,
        **kw,  # type: ignore[arg-type]
    )
    return alarm, mailer


def test_the_first_alarm_is_emailed_at_once() -> None:
    clock = FakeClock(T0)
    alarm, mailer = mail_alarm(clock)
    alarm.add(LETTER)
    assert alarm.poll() is None  # sent, nothing left
    [sent] = mailer.sent
    assert (sent.to_addr, sent.from_addr) == (OPS, SENDER)
    assert sent.subject == "[sendqueue] alarm: 1 dead letter"
    for part in ("Dead letter dl-1", "sq-c1-7", '"task_id": "c1-7"', "database is locked"):
        assert part in sent.text
    assert "held back" not in sent.text
    assert sent.message_id.endswith("@example.com>")


def test_a_second_alarm_within_the_interval_is_held_back_then_listed() -> None:
    clock = FakeClock(T0)
    alarm, mailer = mail_alarm(clock, interval=600)
    alarm.add(letter(1))
    alarm.poll()
    clock.advance(seconds=60)
    alarm.add(letter(2))
    alarm.add(pause())
    assert alarm.poll() == pytest.approx(540)  # the rest of the interval
    assert len(mailer.sent) == 1 and alarm.held_back == 2
    clock.advance(seconds=539)
    assert alarm.poll() == pytest.approx(1)
    assert len(mailer.sent) == 1
    clock.advance(seconds=1)
    assert alarm.poll() is None
    first, second = mailer.sent
    assert "dl-1" in first.text and "dl-2" not in first.text
    assert second.subject == "[sendqueue] alarm: 1 dead letter, 1 campaign auto-paused"
    assert "held back since the last one" in second.text
    assert "Dead letter dl-2" in second.text
    assert "Campaign c9 (Winter sale) paused" in second.text
    assert "auto-paused after 5 failed sends in a row" in second.text
    assert alarm.held_back == 0


def test_the_interval_holds_across_processes_sharing_the_store() -> None:
    clock = FakeClock(T0)
    store = InMemoryTaskStore()
    mailer = RecordingMailer()
    one, _ = mail_alarm(clock, store, mailer, interval=600, retry_seconds=30)
    two, _ = mail_alarm(clock, store, mailer, interval=600, retry_seconds=30)
    one.add(letter(1))
    one.poll()
    clock.advance(seconds=10)
    two.add(letter(2))
    assert two.poll() == 30  # the other process holds the lease: try again later
    assert len(mailer.sent) == 1
    clock.advance(seconds=585)  # 595 s after the first email
    assert two.poll() == 30
    assert len(mailer.sent) == 1
    clock.advance(seconds=5)  # 600 s: the lease has expired, the next try is due at 625 s
    assert two.poll() == 25
    clock.advance(seconds=25)
    assert two.poll() is None
    assert len(mailer.sent) == 2 and "dl-2" in mailer.sent[1].text
    assert not store.acquire_lease(LEASE, "someone", ttl_seconds=1, at=clock.now())


def test_a_storm_lists_the_first_items_and_counts_the_rest() -> None:
    clock = FakeClock(T0)
    alarm, mailer = mail_alarm(clock, max_items=5)
    alarm.add(letter(0))
    alarm.poll()
    for n in range(1, 51):
        alarm.add(letter(n))
    alarm.add(pause())
    clock.advance(seconds=600)
    alarm.poll()
    digest = mailer.sent[1]
    assert digest.subject == "[sendqueue] alarm: 50 dead letters, 1 campaign auto-paused"
    assert "sendqueue raised 51 alarms" in digest.text
    assert [n for n in range(1, 51) if f"Dead letter dl-{n} " in digest.text] == [1, 2, 3, 4, 5]
    assert "... and 46 more not listed here." in digest.text


@pytest.mark.parametrize("error", [TransientMailError("421 busy"), PermanentMailError("550 no")])
def test_a_failed_send_keeps_the_alarms_and_frees_the_interval(error: Exception) -> None:
    clock = FakeClock(T0)
    store = InMemoryTaskStore()
    alarm, mailer = mail_alarm(clock, store, retry_seconds=30)
    mailer.fail_next(error)
    alarm.add(letter(1))
    assert alarm.poll() == 30
    assert mailer.sent == [] and alarm.held_back == 1
    alarm.add(letter(2))
    clock.advance(seconds=30)
    assert alarm.poll() is None
    [sent] = mailer.sent
    assert "dl-1" in sent.text and "dl-2" in sent.text


def test_a_store_that_is_down_holds_the_alarms_and_never_raises() -> None:
    clock = FakeClock(T0)
    store = InMemoryTaskStore()
    alarm, mailer = mail_alarm(clock, store, retry_seconds=30)
    store.set_available(False)
    alarm.add(LETTER)
    assert alarm.poll() == 30
    assert mailer.sent == [] and alarm.held_back == 1
    store.set_available(True)
    clock.advance(seconds=30)
    assert alarm.poll() is None and len(mailer.sent) == 1


def test_stopping_sends_what_was_held_back_at_once() -> None:
    clock = FakeClock(T0)
    alarm, mailer = mail_alarm(clock)
    assert alarm.flush() is True and mailer.sent == []  # nothing held: no email
    alarm.add(letter(1))
    alarm.poll()
    clock.advance(seconds=60)
    alarm.add(letter(2))
    assert alarm.flush() is True
    last = mailer.sent[-1]
    assert len(mailer.sent) == 2 and "dl-2" in last.text
    assert "because the process that held these alarms is stopping" in last.text
    assert alarm.held_back == 0


def test_stopping_after_the_interval_sends_in_turn() -> None:
    clock = FakeClock(T0)
    alarm, mailer = mail_alarm(clock)
    alarm.add(letter(1))
    clock.advance(seconds=601)  # nobody polled (the thread was busy): the interval is over
    assert alarm.flush() is True
    assert "stopping" not in mailer.sent[-1].text


def test_the_background_thread_sends_without_a_poll() -> None:
    mailer = RecordingMailer()
    alarm = MailAlarm(
        mailer, InMemoryTaskStore(), SystemClock(), to_addr=OPS, from_addr=SENDER, interval=600
    )
    alarm.add(LETTER)
    [sent] = mailer.wait_for(1, timeout=10)
    assert "dl-1" in sent.text
    alarm.add(letter(2))  # held back for 10 minutes...
    threading.Event().wait(0.3)  # the thread woke up, found the lease taken, and waits
    assert alarm.held_back == 1 and len(mailer.sent) == 1
    assert alarm.flush(10) is True  # ...until the process stops
    assert len(mailer.sent) == 2 and "dl-2" in mailer.sent[1].text


def test_the_logging_alarm_emails_dead_letters_and_auto_pauses_and_counts_both() -> None:
    clock = FakeClock(T0)
    mail, mailer = mail_alarm(clock)
    events = RecordingEvents()
    alarm = LoggingAlarm(events=events, mail=mail)
    alarm.raise_alarm(LETTER)
    alarm.auto_paused(pause())
    assert mail.held_back == 2
    assert alarm.flush(5) is True
    assert "dl-1" in mailer.sent[0].text and "Campaign c9" in mailer.sent[0].text
    assert events.alarms == [LETTER, pause()]
    assert events.dead_letters == [LETTER]


def test_digest_merge_keeps_order_and_bound() -> None:
    early, late = Digest(3), Digest(3)
    for n in (1, 2):
        early.add(letter(n))
    for n in (3, 4):
        late.add(letter(n))
    late.add(pause())
    merged = early.merge(late)
    assert [getattr(i, "id", None) for i in merged.items] == ["dl-1", "dl-2", "dl-3"]
    assert (merged.dead_letters, merged.auto_pauses, len(merged)) == (4, 1, 5)
    with pytest.raises(ValueError, match="at least one item"):
        Digest(0)


def test_auto_pause_reasons_are_recognised() -> None:
    assert is_auto_paused(auto_pause_reason(5, "550 rejected"))
    assert not is_auto_paused("paused by alice")
    assert not is_auto_paused(None)


# --- settings ---------------------------------------------------------------------------------


def test_the_alarm_email_setting_is_validated_and_named() -> None:
    with pytest.raises(ValidationError, match="SENDQUEUE_ALARM_EMAIL"):
        Settings(alarm_email="not an address", _env_file=None)
    with pytest.raises(ValidationError, match="SENDQUEUE_ALARM_FROM"):
        Settings(alarm_from="a@b@c.example", _env_file=None)
    with pytest.raises(ValidationError, match="SENDQUEUE_ALARM_EMAIL"):
        Settings(alarm_email="ops@example.com\nBcc: x@evil.example", _env_file=None)
    ok = Settings(alarm_email=" Ops <ops@example.com> ", _env_file=None)
    assert ok.alarm_email == "Ops <ops@example.com>"
    assert ok.alarm_sender == ok.default_from  # the campaigns' default sender
    assert Settings(alarm_email="", _env_file=None).alarm_email is None
    assert ok.alarm_email_interval == 600.0


# --- the send worker's auto-pause reaches the alarm --------------------------------------------


def test_an_auto_pause_is_emailed_through_the_campaigns_mailer() -> None:
    clock = FakeClock(T0)
    mailer = RecordingMailer()
    app = fake_app(
        clock=clock, mailer=mailer, auto_pause_after=2, alarm_email=OPS, alarm_from=SENDER
    )
    draft = app.campaign_import.create(
        name="Winter sale",
        recipients=csv_bytes(3),
        policy=open_policy(),
        from_addr="news@example.com",
    ).campaign
    app.provisioner.provision(draft.id)
    mailer.fail_next(*[PermanentMailError("550 rejected")] * 2)
    clock.advance(hours=1)
    scheduler = app.scheduler
    assert isinstance(scheduler, FakeScheduler)
    scheduler.fire_due(app.invoke)
    assert app.store.get_campaign(draft.id).state is CampaignState.PAUSED
    deadline = datetime.now(UTC) + timedelta(seconds=10)
    while not mailer.sent_to(OPS) and datetime.now(UTC) < deadline:
        threading.Event().wait(0.02)
    [sent] = mailer.sent_to(OPS)
    assert sent.subject == "[sendqueue] alarm: 1 campaign auto-paused"
    assert f"Campaign {draft.id} (Winter sale)" in sent.text
    app.close()
