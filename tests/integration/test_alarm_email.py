"""The alarm email through real parts: the embedded scheduler (SQLite) dead-letters failing
invocations, the alarm emails an operator through the SMTP mailer (aiosmtpd), at most once per
10 minutes (the store's lease, SQLite), and the next email lists what was held back."""

from __future__ import annotations

import time
from pathlib import Path

from sendqueue.adapters.alarm import LoggingAlarm
from sendqueue.adapters.scheduler_rules import local_now
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.models import new_token
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from tests.support.app import T0
from tests.support.real import wait_until
from tests.support.smtp import SmtpSink

OPS = "ops@example.com"


def _app(tmp_path: Path, sink: SmtpSink, clock: FakeClock) -> Container:
    settings = Settings(
        _env_file=None,
        database_url=f"sqlite:///{tmp_path / 'store.db'}",
        scheduler_url=f"sqlite:///{tmp_path / 'scheduler.db'}",
        mailer=sink.url(),
        scheduler_retry_backoff=0,
        alarm_email=f"Operator <{OPS}>",
        alarm_from="sendqueue alarms <alarms@example.com>",
    )
    return bootstrap(settings, clock=clock)


def _dead_letter(app: Container, clock: FakeClock, n: int) -> None:
    """A schedule whose invocation fails every time (it provisions a campaign that does not
    exist), fired until the scheduler gives up on it."""
    before = len(app.scheduler.dead_letters())
    app.scheduler.create(
        f"bad-{n}",
        "alarmtest",
        local_now(clock.now(), "UTC"),
        "UTC",
        {"kind": "provision", "campaign_id": f"missing-{n}"},
        new_token(),
    )
    fire_due = app.scheduler.fire_due  # type: ignore[attr-defined]
    wait_until(
        lambda: fire_due(app.invoke) >= 0 and len(app.scheduler.dead_letters()) == before + 1,
        30,
        f"dead letter {n}",
    )


def test_one_email_per_interval_and_the_next_lists_what_was_held_back(
    tmp_path: Path, smtp_sink: SmtpSink
) -> None:
    clock = FakeClock(T0)
    app = _app(tmp_path, smtp_sink, clock)
    alarm = app.alarm
    assert isinstance(alarm, LoggingAlarm) and alarm.mail is not None
    try:
        _dead_letter(app, clock, 1)
        [first] = smtp_sink.wait_for(1, timeout=15)
        assert first.rcpt_tos == (OPS,)
        assert first["From"] == "sendqueue alarms <alarms@example.com>"
        assert first["Subject"] == "[sendqueue] alarm: 1 dead letter"
        body = first.message.get_content()
        assert "missing-1" in body and "bad-1" in body

        clock.advance(minutes=9)
        _dead_letter(app, clock, 2)
        wait_until(lambda: alarm.mail is not None and alarm.mail.held_back == 1, 10, "held")
        time.sleep(0.5)  # the alarm thread had its chance: still one email
        assert len(smtp_sink.messages) == 1

        clock.advance(minutes=1, seconds=1)  # 10 minutes after the first email
        _dead_letter(app, clock, 3)
        _, second = smtp_sink.wait_for(2, timeout=15)
        assert second["Subject"] == "[sendqueue] alarm: 2 dead letters"
        body = second.message.get_content()
        assert "missing-2" in body and "missing-3" in body and "missing-1" not in body
        assert "held back since the last one" in body
        mail = alarm.mail
        # The sink has the message before the client hears its "250" and counts the send.
        wait_until(lambda: mail.sent == 2, 10, "the second send counted")
        assert mail.held_back == 0
    finally:
        app.close()
    assert len(smtp_sink.messages) == 2  # nothing was left to send at close
