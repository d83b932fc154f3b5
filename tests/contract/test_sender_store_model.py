"""The SenderStore's booking rules as a state machine, against a model (memory and SQLite).

Random calls of ``book`` (one to four bookings, on two senders, six slots, two days, caps of
one to three), ``release`` and ``mark_sent``: a call is refused (Overbooked) exactly when the
model says a slot is held by another task or a day would pass the lowest cap the call gives,
and then changes nothing; after every step the usage per day, the booked instants and each
task's booking read back as the model has them.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Protocol, cast

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from sendqueue.adapters.sql import open_store
from sendqueue.domain.errors import Overbooked
from sendqueue.domain.senders import Booking, Sender, SenderDay
from sendqueue.ports import SenderStore, TaskStore
from sendqueue.testing.store import InMemoryTaskStore
from tests.contract.store_backends import T0


class Store(TaskStore, SenderStore, Protocol):
    pass


SENDERS = ("s1", "s2")
TASKS = [f"c1-{i}" for i in range(6)]
DAY0 = T0.date()


@dataclass(frozen=True)
class Held:
    sender: str
    slot: int
    day: date
    sent: bool


def _booking(task: str, sender: str, slot: int, cap: int) -> Booking:
    # three slots a day, an hour apart; the day is the slot's own (UTC here)
    at = T0 + timedelta(days=slot // 3, hours=slot % 3)
    return Booking(sender, at, at.date(), task, "c1", f"{task}@example.com", cap)


bookings = st.lists(
    st.tuples(
        st.sampled_from(TASKS),
        st.sampled_from(SENDERS),
        st.integers(0, 5),
        st.integers(1, 3),
    ),
    min_size=1,
    max_size=4,
    unique_by=lambda b: b[0],
)


class BookingRules(RuleBasedStateMachine):
    def open(self) -> Store:
        return cast(Store, InMemoryTaskStore())

    @initialize()
    def start(self) -> None:
        self.store = self.open()
        for sid in SENDERS:
            self.store.add_sender(Sender(id=sid, email=f"{sid}@example.com", timezone="UTC"))
        self.held: dict[str, Held] = {}
        self.sending: set[tuple[str, date]] = set()  # days that have held a booking

    def _day_counts(self) -> dict[tuple[str, date], int]:
        counts: dict[tuple[str, date], int] = {}
        for h in self.held.values():
            counts[(h.sender, h.day)] = counts.get((h.sender, h.day), 0) + 1
        return counts

    @rule(calls=bookings)
    def book(self, calls: list[tuple[str, str, int, int]]) -> None:
        made = [_booking(t, s, slot, cap) for t, s, slot, cap in calls]
        after = dict(self.held)
        refused = False
        caps: dict[tuple[str, date], int] = {}
        slots: set[tuple[str, int]] = set()
        for (task, sender, slot, cap), b in zip(calls, made, strict=True):
            key = (sender, slot)
            old = after.get(task)
            if old is not None and (old.sender, old.slot) == key:
                continue
            holder = [t for t, h in self.held.items() if (h.sender, h.slot) == key and t != task]
            if holder or key in slots or (old is not None and old.sent):
                refused = True
            slots.add(key)
            caps[(sender, b.day)] = min(caps.get((sender, b.day), cap), cap)
            after[task] = Held(sender, slot, b.day, False)
        if not refused:
            counts: dict[tuple[str, date], int] = {}
            for h in after.values():
                counts[(h.sender, h.day)] = counts.get((h.sender, h.day), 0) + 1
            refused = any(counts.get(day, 0) > cap for day, cap in caps.items())
        try:
            self.store.book(made)
        except Overbooked:
            assert refused, (calls, self.held)
            return
        assert not refused, (calls, self.held)
        self.held = after
        self.sending |= {(h.sender, h.day) for h in after.values()}

    @rule(tasks=st.lists(st.sampled_from(TASKS), max_size=3))
    def release(self, tasks: list[str]) -> None:
        # (its strategy does not depend on the state: generation must replay the same)
        freed = {t for t in tasks if t in self.held and not self.held[t].sent}
        assert self.store.release(tasks) == len(freed)
        for t in freed:
            del self.held[t]

    @rule(task=st.sampled_from(TASKS))
    def mark_sent(self, task: str) -> None:
        h = self.held.get(task)
        expected = h is not None and not h.sent
        assert self.store.mark_sent(task) is expected
        if h is not None:
            self.held[task] = Held(h.sender, h.slot, h.day, True)

    @invariant()
    def reads_match_the_model(self) -> None:
        if not hasattr(self, "store"):
            return
        for sid in SENDERS:
            mine = [h for h in self.held.values() if h.sender == sid]
            days: dict[date, list[int]] = {}
            for h in mine:
                days.setdefault(h.day, [0, 0])[1 if h.sent else 0] += 1
            want = [SenderDay(d, p, s) for d, (p, s) in sorted(days.items())]
            got = self.store.sender_usage(sid, since=DAY0, until=DAY0 + timedelta(days=3))
            assert got == want
            times = self.store.booked_times(sid, since=T0, until=T0 + timedelta(days=3))
            assert times == sorted(_booking("x-0", sid, h.slot, 1).at for h in mine)
            held = sorted(d for s, d in self.sending if s == sid)
            assert self.store.sending_days(sid, since=DAY0) == held
        for task in TASKS:
            booking = self.store.booking_of(task)
            model = self.held.get(task)
            assert (booking is None) == (model is None)
            if booking is not None and model is not None:
                assert (booking.sender_id, booking.at) == (
                    model.sender,
                    _booking(task, model.sender, model.slot, 1).at,
                )

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.close()


class SqliteBookingRules(BookingRules):
    def open(self) -> Store:
        self._dir = tempfile.TemporaryDirectory()
        return cast(Store, open_store(f"sqlite:///{Path(self._dir.name) / 'store.db'}"))

    def teardown(self) -> None:
        super().teardown()
        if hasattr(self, "_dir"):
            self._dir.cleanup()


_SETTINGS = settings(
    max_examples=80, stateful_step_count=20, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
TestMemoryBookingRules = BookingRules.TestCase
TestMemoryBookingRules.settings = _SETTINGS
TestSqliteBookingRules = SqliteBookingRules.TestCase
TestSqliteBookingRules.settings = settings(_SETTINGS, max_examples=25)
