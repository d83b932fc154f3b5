"""Benchmark 1, the planner: one million send instants under a realistic policy.

Policy: Europe/Berlin, Monday to Friday, three windows (08:00-11:00, 13:00-16:00,
18:00-20:00), 10,000 a day, 15 weekday skip dates, starting on 2026-01-05 (so the plan crosses
the spring DST change). The baseline only generates the same number of aware UTC datetimes,
each the previous one plus a fixed step, in a C loop (``itertools.accumulate``): the least any
planner must do, with no calendar, zone or window at all. Both run in this process,
alternately.
"""

from __future__ import annotations

import gc
import itertools
import operator
import time
from datetime import UTC, date, datetime, timedelta
from typing import Any

from bench.common import alternate, summarize
from sendqueue.domain.planner import forget_grids, plan
from sendqueue.domain.policy import SendingPolicy, Window

__all__ = ["TARGET", "naive_baseline", "policy", "run"]

#: The planner must stay within this many times the naive baseline.
TARGET = 5.0


def policy() -> SendingPolicy:
    start = datetime(2026, 1, 5, 7, 0, tzinfo=UTC)
    skips: list[date] = []
    day = date(2026, 1, 6)
    while len(skips) < 15:  # every fifth weekday, spread over the plan
        if day.weekday() < 5:
            skips.append(day)
        day += timedelta(days=5)
    return SendingPolicy(
        timezone="Europe/Berlin",
        per_day=10_000,
        weekdays=frozenset(range(5)),
        windows=(Window(8 * 60, 11 * 60), Window(13 * 60, 16 * 60), Window(18 * 60, 20 * 60)),
        start=start,
        skip_dates=frozenset(skips),
    )


def naive_baseline(count: int) -> list[datetime]:
    """``count`` aware datetimes, 8.64 s apart: no windows, no zone, no calendar."""
    if count <= 0:
        return []
    step = timedelta(seconds=8.64)
    first = datetime(2026, 1, 5, 7, 0, tzinfo=UTC)
    steps = itertools.repeat(step, count - 1)
    return list(itertools.accumulate(steps, operator.add, initial=first))


def run(*, sends: int, repeats: int) -> dict[str, Any]:
    pol = policy()
    times: dict[str, list[float]] = {"sendqueue": [], "baseline": []}
    checked: list[int] = []

    def sendqueue(_: int) -> None:
        gc.collect()
        forget_grids()  # each run plans from cold, as one campaign's provisioning does
        started = time.perf_counter()
        out = plan(pol, sends)
        times["sendqueue"].append(time.perf_counter() - started)
        checked.append(len(out))
        del out

    def baseline(_: int) -> None:
        gc.collect()
        forget_grids()  # each run plans from cold, as one campaign's provisioning does
        started = time.perf_counter()
        out = naive_baseline(sends)
        times["baseline"].append(time.perf_counter() - started)
        del out

    alternate(repeats, sendqueue, baseline)
    if set(checked) != {sends}:
        raise AssertionError(f"the planner returned {checked} sends, expected {sends}")
    sq = summarize([t * 1e9 / sends for t in times["sendqueue"]])
    base = summarize([t * 1e9 / sends for t in times["baseline"]])
    ratio = sq.median / base.median
    return {
        "sends": sends,
        "repeats": repeats,
        "policy": "Europe/Berlin, mon-fri, 08-11 + 13-16 + 18-20, 10,000/day, 15 skip dates",
        "sendqueue_ns_per_send": sq.as_dict(),
        "baseline_ns_per_send": base.as_dict(),
        "sendqueue_seconds": summarize(times["sendqueue"]).as_dict(),
        "baseline_seconds": summarize(times["baseline"]).as_dict(),
        "ratio": ratio,
        "targets": [
            {
                "name": "planner within 5x the naive baseline",
                "value": ratio,
                "limit": TARGET,
                "unit": "x",
                "passed": ratio <= TARGET,
            }
        ],
    }
