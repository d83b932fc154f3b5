"""A sequence's expected load per local day and step (the preview's estimate): the domain
function on exact examples and against follow_up_earliest itself, the stored campaign's and
the draft's previews, the API's preview JSON and the CLI's table."""

from __future__ import annotations

import json
import os
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sendqueue.bootstrap import bootstrap
from sendqueue.cli import app as cli_app
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.followups import follow_up_earliest
from sendqueue.domain.planner import plan
from sendqueue.domain.policy import SendingPolicy, Window
from sendqueue.domain.step_load import step_loads
from sendqueue.domain.steps import Step, parse_delay
from sendqueue.services.importing.recipients import ImportLimits
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.web.queries import summary_view
from tests.support.app import fake_app

# Thursday 2026-12-03, 08:00 UTC: before the window opens
THURSDAY = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)
OFFICE = SendingPolicy(
    timezone="UTC", per_day=2, weekdays=frozenset(range(5)), windows=(Window(540, 1020),)
)
STEPS = (
    Step(1, "Hello {{ name }}", "Hi\n", None, None),
    Step(2, None, "Any news?\n", None, parse_delay("1d")),
    Step(3, None, "Last one\n", None, parse_delay("9h")),
)
ROWS = b"email,name\n" + b"".join(f"u{i}@example.com,U{i}\n".encode() for i in range(5))
THU, FRI, MON, TUE, WED = (date(2026, 12, d) for d in (3, 4, 7, 8, 9))
# Step 1: two a day, Thu, Fri, then Mon. Step 2 (1d): Thursday's on Friday, Friday's on
# Monday (the weekend holds no sending day), Monday's on Tuesday, each at 09:00. Step 3
# (9h): 09:00 + 9h is 18:00, after the window: the next sending day's 09:00.
EXPECTED = [
    ((THU, 2), (FRI, 2), (MON, 1)),
    ((FRI, 2), (MON, 2), (TUE, 1)),
    ((MON, 2), (TUE, 2), (WED, 1)),
]


def test_each_step_lands_on_its_earliest_day_a_friday_send_with_1d_on_monday() -> None:
    sends = plan(OFFICE, 5, now=THURSDAY)
    loads = step_loads(OFFICE, STEPS, sends)
    assert [load.days for load in loads] == EXPECTED
    assert [(load.step, load.after, load.count) for load in loads] == [
        (1, None, 5),
        (2, "1d", 5),
        (3, "9h", 5),
    ]


def test_the_estimate_is_follow_up_earliest_for_every_recipient_across_dst() -> None:
    # Berlin's autumn change, two windows, recipients in other zones, every kind of delay
    policy = SendingPolicy(
        timezone="Europe/Berlin",
        per_day=37,
        weekdays=frozenset({0, 1, 2, 4}),
        windows=(Window(480, 660), Window(780, 990)),
        skip_dates=frozenset({date(2026, 10, 26)}),
    )
    sends = plan(policy, 300, now=datetime(2026, 10, 20, tzinfo=UTC))
    zones = [(None, "America/New_York", "Asia/Tokyo")[i % 3] for i in range(len(sends))]
    delays = ["2d", "90m", "17h", "1d", "45m"]
    steps = (STEPS[0], *(Step(k, None, "x", None, parse_delay(d)) for k, d in enumerate(delays, 2)))
    loads = step_loads(policy, steps, sends, zones)
    current = list(sends)
    for load, step in zip(loads[1:], steps[1:], strict=True):
        assert step.after is not None
        current = [
            follow_up_earliest(policy, s, step.after, z)
            for s, z in zip(current, zones, strict=True)
        ]
        expected: dict[date, int] = {}
        for s in current:
            day = s.astimezone(policy.zone).date()
            expected[day] = expected.get(day, 0) + 1
        assert dict(load.days) == expected, step.number


def test_zones_must_match_the_sends() -> None:
    with pytest.raises(InvalidField) as caught:
        step_loads(OFFICE, STEPS, plan(OFFICE, 3, now=THURSDAY), [None])
    assert caught.value.field == "zones"


def test_the_preview_of_a_stored_sequence_and_of_its_draft_counts_each_step() -> None:
    app = fake_app(clock=FakeClock(THURSDAY))
    try:
        created = app.campaign_import.create(
            name="seq", recipients=ROWS, policy=OFFICE, from_addr="n@example.com", steps=STEPS
        )
        summary = app.campaign_previews.preview_summary(created.campaign.id)
        assert [load.days for load in summary.steps] == EXPECTED
        draft = app.campaign_import.validate(
            name="seq", recipients=ROWS, from_addr="n@example.com", steps=STEPS,
            limits=ImportLimits(),
        )  # fmt: skip
        assert [load.days for load in app.campaign_previews.draft_summary(draft, OFFICE).steps] == (
            EXPECTED
        )
        view = summary_view(OFFICE, summary).model_dump(exclude_none=True)
        assert [(s["step"], s.get("after"), s["count"]) for s in view["steps"]] == [
            (1, None, 5),
            (2, "1d", 5),
            (3, "9h", 5),
        ]
        assert view["steps"][1]["days"] == [
            {"day": "2026-12-04", "count": 2},
            {"day": "2026-12-07", "count": 2},
            {"day": "2026-12-08", "count": 1},
        ]
        assert "no one answered" in view["steps_note"]
        # a campaign of one email has no per-step table
        single = app.campaign_import.create(
            name="one", recipients=ROWS, policy=OFFICE, from_addr="n@example.com",
            steps=STEPS[:1],
        )  # fmt: skip
        alone = app.campaign_previews.preview_summary(single.campaign.id)
        assert alone.steps == ()
        assert "steps" not in summary_view(OFFICE, alone).model_dump(exclude_none=True)
    finally:
        app.close()


def test_the_cli_preview_shows_a_table_of_days_by_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in list(os.environ):
        if key.startswith("SENDQUEUE_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    env = {
        "SENDQUEUE_DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}",
        "SENDQUEUE_SCHEDULER_URL": f"sqlite:///{tmp_path / 'scheduler.db'}",
        "SENDQUEUE_MAILER": f"maildir:{tmp_path / 'outbox'}",
        "SENDQUEUE_DEFAULT_TIMEZONE": "UTC",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    container = bootstrap(Settings(_env_file=None))
    try:
        start = datetime.now(UTC) + timedelta(days=1)
        policy = SendingPolicy(**{**OFFICE.__dict__, "start": start})
        cid = container.campaign_import.create(
            name="seq", recipients=ROWS, policy=policy, from_addr="n@example.com", steps=STEPS
        ).campaign.id
    finally:
        container.close()
    runner = CliRunner()
    result = runner.invoke(cli_app, ["campaign", "preview", cid, "--json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert [(s["step"], s["after"], s["count"]) for s in data["steps"]] == [
        (1, None, 5),
        (2, "1d", 5),
        (3, "9h", 5),
    ]
    assert "no one answered" in data["steps_note"]
    text = runner.invoke(cli_app, ["campaign", "preview", cid])
    assert text.exit_code == 0, text.stderr
    assert "per day and step" in text.stdout
    assert "step 2 (+1d)" in text.stdout and "step 3 (+9h)" in text.stdout
    assert "capacity (per_day, sender caps) is not counted" in " ".join(text.stdout.split())
