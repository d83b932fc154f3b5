"""The SenderStore contract (sendqueue.ports.SenderStore), run against every task store.

The backends are the store contracts' (:mod:`tests.contract.store_backends`): memory,
SQLite, PostgreSQL and DynamoDB on moto. Besides the port's own calls: the new fields of
campaigns (senders, local time), recipients (timezone) and tasks (sender, timezone) round-trip.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo

import pytest

from sendqueue.domain.errors import (
    Conflict,
    IllegalTransition,
    NotFound,
    Overbooked,
    StoreUnavailable,
)
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Recipient
from sendqueue.domain.senders import Booking, OAuthGrant, Sender, SenderDay
from sendqueue.ports import SenderStore, TaskStore
from tests.contract.store_backends import (
    T0,
    Backend,
    backend,
    campaign,
    make_task,
    recipients,
)

__all__ = ["backend"]  # the fixture: every store of the TaskStore contract


class Store(TaskStore, SenderStore, Protocol):
    """Every task store is a sender store too."""


@pytest.fixture
def store(backend: Backend) -> Store:
    return backend.handle()


def sender(sid: str = "s1", email: str = "anna@example.com", **kw: object) -> Sender:
    return Sender(id=sid, email=email, **kw)  # type: ignore[arg-type]


def booking(
    task: str, minute: int, *, sid: str = "s1", cap: int = 50, day: date | None = None
) -> Booking:
    at = T0 + timedelta(minutes=minute)
    return Booking(
        sender_id=sid,
        at=at,
        day=day or at.date(),
        task_id=task,
        campaign_id=task.rsplit("-", 1)[0],
        recipient=f"{task}@example.com",
        cap=cap,
    )


# --- senders ----------------------------------------------------------------------------------


def test_a_sender_round_trips_with_its_transport(store: Store) -> None:
    full = sender(
        name="Anna Example",
        reply_to="replies@example.com",
        transport="smtp://anna:secret@mail.example.com:587?security=starttls",
        daily_cap=30,
        min_gap_seconds=120,
        timezone="America/New_York",
        warmup_start=5,
        warmup_step=3,
        warmup_from=date(2026, 12, 1),
    )
    store.add_sender(full)
    assert store.get_sender("s1") == full
    assert store.list_senders() == [full]


def test_a_sender_round_trips_with_its_mailbox_signature_and_oauth(store: Store) -> None:
    grant = OAuthGrant(
        token_url="https://login.example.com/token",
        client_id="app-1",
        refresh_token="r" * 1500,
        client_secret="shh",
        scope="https://outlook.office.com/SMTP.Send offline_access",
    )
    full = sender(
        imap="imaps://anna:secret@imap.example.com:993/INBOX",
        signature_text="Anna\nSales, Example",
        signature_html="<p>Anna<br>Sales, Example</p>",
        oauth=grant,
    )
    store.add_sender(full)
    assert store.get_sender("s1") == full
    store.update_sender(replace(full, imap=None, signature_html=None, oauth=None))
    assert store.get_sender("s1") == replace(full, imap=None, signature_html=None, oauth=None)


def test_senders_are_listed_by_address(store: Store) -> None:
    store.add_sender(sender("s2", "zed@example.com"))
    store.add_sender(sender("s1", "bob@example.com"))
    assert [s.email for s in store.list_senders()] == ["bob@example.com", "zed@example.com"]


def test_a_taken_id_or_address_conflicts(store: Store) -> None:
    store.add_sender(sender())
    with pytest.raises(Conflict):
        store.add_sender(sender("s1", "other@example.com"))
    with pytest.raises(Conflict):
        store.add_sender(sender("s2", "ANNA@example.com"))
    assert [s.id for s in store.list_senders()] == ["s1"]


def test_update_replaces_and_checks_the_address(store: Store) -> None:
    store.add_sender(sender())
    store.add_sender(sender("s2", "bob@example.com"))
    store.update_sender(sender(daily_cap=10, name="Anna"))
    assert store.get_sender("s1").daily_cap == 10
    with pytest.raises(Conflict):
        store.update_sender(sender("s1", "bob@example.com"))
    assert store.get_sender("s1").email == "anna@example.com"
    with pytest.raises(NotFound):
        store.update_sender(sender("s9", "new@example.com"))


def test_unknown_senders_are_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        store.get_sender("s9")
    with pytest.raises(NotFound):
        store.remove_sender("s9")


def test_remove_refuses_a_sender_with_planned_sends(store: Store) -> None:
    store.add_sender(sender())
    store.book([booking("c1-0", 0)])
    with pytest.raises(Conflict):
        store.remove_sender("s1")
    store.mark_sent("c1-0")
    store.remove_sender("s1")
    with pytest.raises(NotFound):
        store.get_sender("s1")
    assert store.booking_of("c1-0") is None
    assert store.sender_usage("s1", since=T0.date(), until=T0.date() + timedelta(days=1)) == []


# --- booking ----------------------------------------------------------------------------------


def usage(store: Store, sid: str = "s1", days: int = 3) -> list[SenderDay]:
    return store.sender_usage(sid, since=T0.date(), until=T0.date() + timedelta(days=days))


def test_book_counts_planned_per_day_and_reads_by_range(store: Store) -> None:
    store.add_sender(sender())
    store.book([booking("c1-0", 0), booking("c1-1", 2), booking("c1-2", 60 * 24)])
    assert usage(store) == [
        SenderDay(T0.date(), 2, 0),
        SenderDay(T0.date() + timedelta(days=1), 1, 0),
    ]
    got = store.booked_times("s1", since=T0, until=T0 + timedelta(minutes=2))
    assert got == [T0]
    assert all(t.tzinfo is not None and t.utcoffset() == timedelta(0) for t in got)
    assert store.booked_times("s1", since=T0, until=T0 + timedelta(days=2)) == [
        T0,
        T0 + timedelta(minutes=2),
        T0 + timedelta(days=1),
    ]
    assert store.booked_times("s2", since=T0, until=T0 + timedelta(days=2)) == []


def test_booking_of_reads_back_the_booking(store: Store) -> None:
    store.add_sender(sender())
    made = booking("c1-0", 5, cap=7)
    store.book([made])
    assert store.booking_of("c1-0") == made
    assert store.booking_of("c1-9") is None


def test_a_taken_slot_is_refused_and_nothing_of_the_call_is_booked(store: Store) -> None:
    store.add_sender(sender())
    store.book([booking("c1-0", 0)])
    with pytest.raises(Overbooked) as caught:
        store.book([booking("c2-0", 1), booking("c2-1", 0)])
    assert caught.value.sender_id == "s1"
    assert store.booking_of("c2-0") is None
    assert usage(store) == [SenderDay(T0.date(), 1, 0)]


def test_insert_tasks_books_their_slots_in_the_same_write(store: Store) -> None:
    store.add_sender(sender())
    store.create_campaign(campaign("c1"), recipients(3))
    tasks = [make_task("c1", i, sender_id="s1", sender="anna@example.com") for i in range(3)]
    made = [booking(t.id, i) for i, t in enumerate(tasks)]
    assert store.insert_tasks(tasks, at=T0, bookings=made) == 3
    assert [store.booking_of(t.id) for t in tasks] == made
    assert store.get_task("c1-2") is not None
    assert usage(store) == [SenderDay(T0.date(), 3, 0)]


def test_insert_tasks_refused_for_a_taken_slot_inserts_and_books_nothing(store: Store) -> None:
    store.add_sender(sender())
    store.book([booking("c0-0", 1)])
    store.create_campaign(campaign("c1"), recipients(2))
    tasks = [make_task("c1", i) for i in range(2)]
    with pytest.raises(Overbooked) as caught:
        store.insert_tasks(tasks, at=T0, bookings=[booking("c1-0", 0), booking("c1-1", 1)])
    assert caught.value.sender_id == "s1"
    assert store.get_tasks([t.id for t in tasks]) == {}
    assert store.booking_of("c1-0") is None
    assert usage(store) == [SenderDay(T0.date(), 1, 0)]
    # The same tasks, planned again on free slots, go in.
    assert store.insert_tasks(tasks, at=T0, bookings=[booking("c1-0", 0), booking("c1-1", 2)])
    assert usage(store) == [SenderDay(T0.date(), 3, 0)]


def test_insert_tasks_refused_past_a_cap_inserts_and_books_nothing(store: Store) -> None:
    store.add_sender(sender())
    store.create_campaign(campaign("c1"), recipients(3))
    tasks = [make_task("c1", i) for i in range(3)]
    with pytest.raises(Overbooked) as caught:
        store.insert_tasks(
            tasks, at=T0, bookings=[booking(t.id, i, cap=2) for i, t in enumerate(tasks)]
        )
    assert caught.value.day == T0.date()
    assert store.get_tasks([t.id for t in tasks]) == {}
    assert usage(store) == []


def test_insert_tasks_with_a_bad_task_books_nothing(store: Store) -> None:
    store.add_sender(sender())
    store.create_campaign(campaign("c1"), recipients(1))
    running = make_task("c1", 0, state=TaskState.RUNNING)
    with pytest.raises(IllegalTransition):
        store.insert_tasks([running], at=T0, bookings=[booking(running.id, 0)])
    assert store.booking_of(running.id) is None
    assert usage(store) == []


def test_a_booking_left_without_its_task_moves_when_the_task_goes_in(store: Store) -> None:
    """A run that stopped between booking and inserting (DynamoDB has no transaction over both)
    leaves a booking; the resumed run's insert moves it to the slot it plans now."""
    store.add_sender(sender())
    store.book([booking("c1-0", 0)])
    store.create_campaign(campaign("c1"), recipients(1))
    assert store.insert_tasks([make_task("c1", 0)], at=T0, bookings=[booking("c1-0", 5)]) == 1
    held = store.booking_of("c1-0")
    assert held is not None and held.at == T0 + timedelta(minutes=5)
    assert usage(store) == [SenderDay(T0.date(), 1, 0)]


def test_two_bookings_of_one_slot_in_one_call_are_refused(store: Store) -> None:
    store.add_sender(sender())
    with pytest.raises(Overbooked):
        store.book([booking("c1-0", 0), booking("c1-1", 0)])
    assert usage(store) == []


def test_a_full_day_is_refused_counting_the_call_itself(store: Store) -> None:
    store.add_sender(sender())
    store.book([booking("c1-0", 0, cap=3), booking("c1-1", 1, cap=3)])
    with pytest.raises(Overbooked) as caught:
        store.book([booking("c2-0", 2, cap=3), booking("c2-1", 3, cap=3)])
    assert caught.value.day == T0.date()
    assert store.booking_of("c2-0") is None
    store.book([booking("c2-0", 2, cap=3)])
    assert usage(store) == [SenderDay(T0.date(), 3, 0)]


def test_sent_bookings_count_against_the_cap(store: Store) -> None:
    store.add_sender(sender())
    store.book([booking("c1-0", 0, cap=1)])
    assert store.mark_sent("c1-0") is True
    assert store.mark_sent("c1-0") is False
    assert store.mark_sent("c1-9") is False
    assert usage(store) == [SenderDay(T0.date(), 0, 1)]
    with pytest.raises(Overbooked):
        store.book([booking("c2-0", 5, cap=1)])


def test_the_lowest_cap_of_a_day_in_one_call_is_checked(store: Store) -> None:
    store.add_sender(sender())
    with pytest.raises(Overbooked):
        store.book([booking("c1-0", 0, cap=5), booking("c1-1", 1, cap=1)])


def test_booking_the_same_slot_again_changes_nothing(store: Store) -> None:
    store.add_sender(sender())
    store.book([booking("c1-0", 0, cap=1)])
    store.book([booking("c1-0", 0, cap=1)])
    assert usage(store) == [SenderDay(T0.date(), 1, 0)]


def test_booking_a_booked_task_moves_it(store: Store) -> None:
    store.add_sender(sender())
    store.book([booking("c1-0", 0, cap=1)])
    # The day is full, but the task's own booking is freed in the same write.
    store.book([booking("c1-0", 30, cap=1)])
    assert store.booked_times("s1", since=T0, until=T0 + timedelta(days=1)) == [
        T0 + timedelta(minutes=30)
    ]
    assert usage(store) == [SenderDay(T0.date(), 1, 0)]
    # To another day, and another sender.
    store.add_sender(sender("s2", "bob@example.com"))
    store.book([booking("c1-0", 60 * 24, sid="s2")])
    assert usage(store) == []
    assert usage(store, "s2") == [SenderDay(T0.date() + timedelta(days=1), 1, 0)]
    # The old slot is free for another task.
    store.book([booking("c2-0", 30, cap=1)])


def test_a_sent_booking_never_moves(store: Store) -> None:
    store.add_sender(sender())
    store.book([booking("c1-0", 0)])
    store.mark_sent("c1-0")
    with pytest.raises(Overbooked):
        store.book([booking("c1-0", 30)])
    store.book([booking("c1-0", 0)])  # the same slot again: nothing changes
    assert store.booked_times("s1", since=T0, until=T0 + timedelta(days=1)) == [T0]
    assert usage(store) == [SenderDay(T0.date(), 0, 1)]


def test_a_slot_a_task_of_the_call_leaves_is_still_taken(store: Store) -> None:
    store.add_sender(sender())
    store.add_sender(sender("s2", "bob@example.com"))
    store.book([booking("c1-0", 0)])
    with pytest.raises(Overbooked):
        store.book([booking("c1-0", 0, sid="s2"), booking("c1-1", 0)])
    assert store.booking_of("c1-0") == booking("c1-0", 0)
    assert store.booking_of("c1-1") is None


def test_release_frees_planned_bookings_only(store: Store) -> None:
    store.add_sender(sender())
    store.book([booking("c1-0", 0), booking("c1-1", 1), booking("c1-2", 2)])
    store.mark_sent("c1-2")
    assert store.release(["c1-0", "c1-2", "c1-9"]) == 1
    assert store.release(["c1-0"]) == 0
    assert store.booking_of("c1-0") is None
    assert store.booking_of("c1-2") is not None
    assert usage(store) == [SenderDay(T0.date(), 1, 1)]
    store.book([booking("c2-0", 0)])  # the freed slot


def test_days_are_the_bookings_own_and_usage_skips_empty_days(store: Store) -> None:
    store.add_sender(sender(timezone="America/New_York"))
    # 01:00 UTC on Dec 2 is still Dec 1 in New York: the booking names its own day.
    at_minute = 17 * 60
    store.book([booking("c1-0", at_minute, day=date(2026, 12, 1))])
    store.release(["c1-0"])
    assert usage(store) == []


def test_a_day_that_held_a_booking_stays_a_sending_day(store: Store) -> None:
    store.add_sender(sender())
    store.add_sender(sender("s2", "bob@example.com"))
    day = [T0.date() + timedelta(days=n) for n in range(8)]
    store.book([booking("c1-0", 0), booking("c1-1", 60 * 24), booking("c1-2", 60 * 48)])
    store.mark_sent("c1-0")
    store.release(["c1-1"])
    store.book([booking("c1-2", 60 * 72)])  # moved off day 2
    assert usage(store, days=8) == [SenderDay(day[0], 0, 1), SenderDay(day[3], 1, 0)]
    assert store.sending_days("s1", since=day[0]) == day[:4]
    assert store.sending_days("s1", since=day[2]) == day[2:4]
    assert store.sending_days("s2", since=day[0]) == []
    # refused calls leave no day behind: a taken slot, a full day, tasks refused with theirs
    with pytest.raises(Overbooked):
        store.book([booking("c2-0", 60 * 24 * 5), booking("c2-1", 60 * 72)])
    with pytest.raises(Overbooked):
        store.book([booking("c3-0", 60 * 24 * 6, cap=1), booking("c3-1", 60 * 24 * 6 + 1, cap=1)])
    store.create_campaign(campaign("c4"), recipients(2))
    tasks = [make_task("c4", i) for i in range(2)]
    with pytest.raises(Overbooked):
        store.insert_tasks(
            tasks,
            at=T0,
            bookings=[booking(t.id, 60 * 24 * 7 + i, cap=1) for i, t in enumerate(tasks)],
        )
    running = make_task("c4", 0, state=TaskState.RUNNING)
    with pytest.raises(IllegalTransition):
        store.insert_tasks([running], at=T0, bookings=[booking(running.id, 60 * 24 * 7)])
    assert store.sending_days("s1", since=day[0]) == day[:4]
    store.release(["c1-2"])
    store.remove_sender("s1")
    assert store.sending_days("s1", since=day[0]) == []


def test_sticky_senders_remember_the_first_sender(store: Store) -> None:
    store.add_sender(sender())
    store.add_sender(sender("s2", "bob@example.com"))
    first = replace(booking("c1-0", 0), recipient="x@example.com")
    later = replace(booking("c2-0", 5, sid="s2"), recipient="x@example.com")
    store.book([first])
    store.book([later])
    assert store.sticky_senders(["x@example.com", "y@example.com"]) == {"x@example.com": "s1"}
    assert store.sticky_senders([]) == {}


def test_concurrent_bookings_of_one_day_never_pass_the_cap(backend: Backend) -> None:
    first = backend.handle()
    first.add_sender(sender())
    handles = [backend.handle() for _ in range(4)]
    won: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(handles))

    def run(n: int, handle: Store) -> None:
        barrier.wait()
        for i in range(5):
            try:
                handle.book([booking(f"c{n}-{i}", n * 100 + i * 2, cap=7)])
                won.append(1)
            except Overbooked:
                pass
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=run, args=(n, h)) for n, h in enumerate(handles)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(won) == 7
    assert usage(first) == [SenderDay(T0.date(), 7, 0)]


def test_an_unreachable_store_raises_store_unavailable(backend: Backend) -> None:
    store = backend.unreachable()
    with pytest.raises(StoreUnavailable):
        store.list_senders()
    with pytest.raises(StoreUnavailable):
        store.book([booking("c1-0", 0)])


# --- the new fields of campaigns, recipients and tasks ---------------------------------------


def test_campaign_senders_local_time_and_zones_round_trip(store: Store) -> None:
    made = campaign(sender_ids=("s1", "s2"), local_time=True)
    people = [
        replace(r, timezone="America/New_York" if r.position else None) for r in recipients(2)
    ]
    store.create_campaign(made, people)
    got = store.get_campaign("c1")
    assert got.sender_ids == ("s1", "s2")
    assert got.local_time is True
    assert [r.timezone for r in store.list_recipients("c1")] == [None, "America/New_York"]
    task = make_task("c1", 0, sender_id="s1", sender="anna@example.com", timezone="Asia/Tokyo")
    store.insert_tasks([task, make_task("c1", 1)], at=T0)
    stored = store.get_task("c1-0")
    assert stored is not None
    assert (stored.sender_id, stored.sender, stored.timezone) == (
        "s1",
        "anna@example.com",
        "Asia/Tokyo",
    )
    plain = store.get_task("c1-1")
    assert plain is not None
    assert (plain.sender_id, plain.sender, plain.timezone) == (None, None, None)
    assert [t.sender for t in store.list_tasks("c1")] == ["anna@example.com", None]


def test_a_campaign_without_senders_reads_back_as_before(store: Store) -> None:
    store.create_campaign(campaign(), [Recipient(0, "a@example.com")])
    got = store.get_campaign("c1")
    assert (got.sender_ids, got.local_time) == ((), False)
    assert store.list_recipients("c1")[0].timezone is None


def test_booked_instants_are_utc_whatever_zone_they_were_given_in(store: Store) -> None:
    store.add_sender(sender())
    local = datetime(2026, 12, 1, 10, 0, tzinfo=UTC).astimezone(ZoneInfo("Europe/Berlin"))
    store.book([replace(booking("c1-0", 0), at=local)])
    got = store.booked_times("s1", since=T0, until=T0 + timedelta(days=1))
    assert got == [datetime(2026, 12, 1, 10, 0, tzinfo=UTC)]
