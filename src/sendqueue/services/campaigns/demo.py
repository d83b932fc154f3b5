"""The demo campaign: sends that start within seconds and come at a steady pace."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from sendqueue.domain.policy import SendingPolicy, Window, load_timezone

__all__ = ["demo_csv", "demo_policy"]


def demo_policy(now: datetime, zone_name: str, count: int, interval: float) -> SendingPolicy:
    """A policy whose first send is ~2 s after ``now`` and the next every ``interval`` seconds.

    The window opens at the current local minute and is a few minutes longer than needed, so
    all ``count`` sends fit into today's slots after the start (a window that would pass
    midnight is split in two).
    """
    zone = load_timezone(zone_name)
    local = now.astimezone(zone)
    first = local.hour * 60 + local.minute
    length = math.ceil(count * interval / 60) + 3
    per_day = min(10_000, int(length * 60 / interval))
    end = first + length
    windows = [Window(first, min(end, 1440))]
    if end > 1440:
        windows.append(Window(0, end - 1440))
    return SendingPolicy(
        timezone=zone_name,
        per_day=per_day,
        weekdays=frozenset(range(7)),
        windows=tuple(windows),
        start=now + timedelta(seconds=2),
    )


def demo_csv(count: int, domain: str = "example.com") -> bytes:
    """``count`` sample recipients with a template variable (``city``)."""
    cities = ["Berlin", "Lisbon", "Oslo", "Kraków", "Zürich", "Sevilla"]
    lines = ["email,name,city"]
    for i in range(count):
        lines.append(f"demo{i + 1:03d}@{domain},Demo Recipient {i + 1},{cities[i % len(cities)]}")
    return ("\n".join(lines) + "\n").encode()
