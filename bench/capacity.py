"""Benchmark 10, the capacity-aware planner: 100,000 sends across 100 senders, with
50,000 bookings already in their books, against :func:`plan` of the same sends per send.

Policy: benchmark 1's (Europe/Berlin, Monday to Friday, 08:00-11:00, 13:00-16:00 and
18:00-20:00, 10,000 a day, 15 weekday skip dates, from 2026-01-05). Senders: a daily cap of
200 and the default minimum gap of 60 s; half in Europe/Berlin, a quarter each in
Europe/London and America/New_York (their days are not the campaign's), one in ten on a
warm-up (20 on the first day, 20 more a day). The bookings other campaigns hold: spread over
the senders and the plan's weeks at minute starts between 07:00 and 19:00 UTC (so they sit on
the slots the plan wants), never past a cap. Recipients are assigned round-robin
(:func:`assign_senders`).

Measured: :func:`plan_with_senders` on fresh books (made with ``SenderBook.load`` from the
bookings before the clock starts), and :func:`plan` of the same count, alternately in this
process (``--capacity-repeats`` times each, 11 by default: a run is a tenth of a second, so a
burst of load elsewhere hits few). The figure is each one's wall-clock time per send; the
target is the ratio of the medians. docs/performance.md, "Capacity planning", has the profile.
"""

from __future__ import annotations

import gc
import random
import time
from collections import Counter, defaultdict
from datetime import UTC, date, datetime, timedelta
from typing import Any

from bench import planner
from bench.common import alternate, summarize
from sendqueue.domain.capacity import SenderBook, assign_senders, plan_with_senders
from sendqueue.domain.planner import forget_grids, plan
from sendqueue.domain.senders import Sender, SenderDay

__all__ = ["TARGET", "bookings", "run", "senders"]

#: The capacity planner must stay within this many times plan() per send.
TARGET = 5.0
_ZONES = ("Europe/Berlin", "Europe/Berlin", "Europe/London", "America/New_York")


def senders(n: int) -> list[Sender]:
    return [
        Sender(
            id=f"s{i:03d}",
            email=f"box{i}@example.com",
            daily_cap=200,
            timezone=_ZONES[i % len(_ZONES)],
            warmup_start=20 if i % 10 == 9 else None,
            warmup_step=20 if i % 10 == 9 else None,
            warmup_from=date(2026, 1, 5) if i % 10 == 9 else None,
        )
        for i in range(n)
    ]


def bookings(
    pool: list[Sender], total: int, *, seed: int = 13
) -> dict[str, tuple[list[datetime], list[SenderDay]]]:
    """What other campaigns hold: per sender its booked instants and its days' usage, as the
    store's ``booked_times`` and ``sender_usage`` give them."""
    rng = random.Random(seed)
    weekdays = [
        date(2026, 1, 5) + timedelta(days=d)
        for d in range(28)
        if (date(2026, 1, 5) + timedelta(days=d)).weekday() < 5
    ]
    books = {s.id: SenderBook(s) for s in pool}
    times: dict[str, list[datetime]] = defaultdict(list)
    made = attempts = 0
    while made < total and attempts < 20 * total:
        attempts += 1
        sender = pool[rng.randrange(len(pool))]
        day = rng.choice(weekdays)
        at = datetime.combine(day, datetime.min.time(), tzinfo=UTC) + timedelta(
            minutes=rng.randrange(7 * 60, 19 * 60)
        )
        book = books[sender.id]
        if book.has_room(at, book.day_of(at)):
            book.add(at)
            times[sender.id].append(at)
            made += 1
    out = {}
    for sender in pool:
        days = Counter(books[sender.id].day_of(at) for at in times[sender.id])
        out[sender.id] = (
            sorted(times[sender.id]),
            [SenderDay(day, n, 0) for day, n in sorted(days.items())],
        )
    return out


def run(*, sends: int, senders_count: int, booked: int, repeats: int) -> dict[str, Any]:
    pol = planner.policy()
    pool = senders(senders_count)
    held = bookings(pool, booked)
    held_count = sum(len(times) for times, _ in held.values())
    recipients = [f"r{i}@example.com" for i in range(sends)]
    assigned: list[str | None] = list(assign_senders(recipients, [s.id for s in pool], {}))
    now = datetime(2026, 1, 5, 6, tzinfo=UTC)
    times: dict[str, list[float]] = {"sendqueue": [], "plan": []}
    checked: list[int] = []

    def capacity(_: int) -> None:
        books = {s.id: SenderBook.load(s, *held[s.id]) for s in pool}
        gc.collect()
        forget_grids()  # each run plans from cold, as one campaign's provisioning does
        started = time.perf_counter()
        out = plan_with_senders(pol, assigned, books, now=now)
        times["sendqueue"].append(time.perf_counter() - started)
        checked.append(len(out))
        del out, books

    def single(_: int) -> None:
        gc.collect()
        forget_grids()  # each run plans from cold, as one campaign's provisioning does
        started = time.perf_counter()
        out = plan(pol, sends, now=now)
        times["plan"].append(time.perf_counter() - started)
        del out

    alternate(repeats, capacity, single)
    if set(checked) != {sends}:
        raise AssertionError(f"the capacity planner returned {checked} sends, expected {sends}")
    sq = summarize([t * 1e6 / sends for t in times["sendqueue"]])
    base = summarize([t * 1e6 / sends for t in times["plan"]])
    ratio = sq.median / base.median
    return {
        "sends": sends,
        "senders": senders_count,
        "bookings": held_count,
        "repeats": repeats,
        "policy": "benchmark 1's: Europe/Berlin, mon-fri, 08-11 + 13-16 + 18-20, 10,000/day",
        "sendqueue_us_per_send": sq.as_dict(),
        "plan_us_per_send": base.as_dict(),
        "sendqueue_seconds": summarize(times["sendqueue"]).as_dict(),
        "plan_seconds": summarize(times["plan"]).as_dict(),
        "ratio": ratio,
        "targets": [
            {
                "name": "capacity planner within 5x plan() per send",
                "value": ratio,
                "limit": TARGET,
                "unit": "x",
                "passed": ratio <= TARGET,
            }
        ],
    }
