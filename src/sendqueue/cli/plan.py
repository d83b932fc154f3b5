"""``sendqueue plan``: a plan of send times, without any store."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer

from sendqueue.cli.common import (
    JitterOpt,
    JsonOpt,
    PerDayOpt,
    SeedOpt,
    SkipOpt,
    TimezoneOpt,
    WeekdaysOpt,
    WindowOpt,
    build_policy,
    handle_errors,
    out,
    print_json,
)
from sendqueue.cli.render import plan_rows, print_plan
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.planner import plan
from sendqueue.settings import Settings, load_settings

__all__ = ["plan_cmd"]


@handle_errors
def plan_cmd(
    count: Annotated[int, typer.Option("--count", help="How many sends to plan.")] = 20,
    timezone: TimezoneOpt = None,
    per_day: PerDayOpt = 20,
    weekdays: WeekdaysOpt = "mon-fri",
    window: WindowOpt = None,
    start: Annotated[
        str | None, typer.Option("--start", help="ISO-8601 start; no offset = local [default: now]")
    ] = None,
    skip_date: SkipOpt = None,
    jitter: JitterOpt = 0,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Print a plan of send times without touching any store."""
    if count < 0:
        raise InvalidField("count", count, "must be 0 or more")
    policy = build_policy(
        timezone=timezone,
        per_day=per_day,
        weekdays=weekdays,
        windows=window,
        start=start,
        skip_dates=skip_date,
        jitter=jitter,
        seed=seed,
        default_timezone=load_settings(Settings).default_timezone,
    )
    sends = plan(policy, count, now=None if policy.start else datetime.now(UTC))
    if as_json:
        print_json({"timezone": policy.timezone, "sends": plan_rows(sends, policy.timezone)})
        return
    out.print(policy.describe())
    print_plan(sends, policy.timezone)
