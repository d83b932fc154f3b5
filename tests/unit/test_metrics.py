"""The metrics adapter: the documented metrics in a registry per container, the send outcomes
the worker reports (``skipped`` included), the dead-letter depth read at scrape time, and the
worker's own metrics endpoint."""

from __future__ import annotations

import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest

from sendqueue.adapters.metrics import PrometheusMetrics
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.errors import SchedulerError
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import DeadLetter, Task, expected_schedule_name
from sendqueue.services.scheduling.schedules import send_payload
from sendqueue.settings import Settings
from sendqueue.testing import (
    FakeClock,
    FakeScheduler,
    InMemoryTaskStore,
    RecordingEvents,
    RecordingMailer,
)
from tests.support.app import T0, csv_bytes, fake_app, open_policy

LETTER = DeadLetter(
    "dl-1", "sq-c1-0", "c1", {"task_id": "c1-0"}, "boom", 3, datetime(2026, 12, 1, tzinfo=UTC)
)


def _one_task(app: Container) -> Task:
    cid = app.campaign_import.create(
        name="m", recipients=csv_bytes(1), policy=open_policy()
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    (task,) = app.store.list_tasks(cid)
    return task


def _sends(app: Container, outcome: str) -> float:
    return app.metrics.value("sendqueue_sends_total", outcome=outcome)


def test_the_documented_metrics_are_exported_with_their_types_and_labels() -> None:
    body, content_type = PrometheusMetrics(dead_letter_depth=lambda: 0).render()
    text = body.decode()
    # as before prometheus_client: the 0.0.4 text format and no *_created series
    assert content_type.startswith("text/plain; version=0.0.4")
    assert "_created" not in text
    for name, kind in [
        ("sendqueue_sends_total", "counter"),
        ("sendqueue_send_lateness_seconds", "histogram"),
        ("sendqueue_dead_letters_total", "counter"),
        ("sendqueue_dead_letter_depth", "gauge"),
        ("sendqueue_reconciler_repairs_total", "counter"),
        ("sendqueue_alarms_total", "counter"),
    ]:
        assert f"# TYPE {name} {kind}\n" in text
    for outcome in ("sent", "transient", "permanent", "skipped"):
        assert f'sendqueue_sends_total{{outcome="{outcome}"}} 0.0\n' in text
    assert 'sendqueue_send_lateness_seconds_bucket{le="0.05"} 0.0\n' in text
    assert 'sendqueue_send_lateness_seconds_bucket{le="600.0"} 0.0\n' in text
    assert "\nsendqueue_alarms_total 0.0\n" in text


def test_events_are_recorded_and_negative_lateness_counts_as_zero() -> None:
    metrics = PrometheusMetrics()
    metrics.send_finished("sent", 1.5)
    metrics.send_finished("sent", -0.3)  # sent within the early tolerance
    metrics.send_finished("transient")
    metrics.repaired("stale_retried", 3)
    metrics.dead_lettered(LETTER)
    metrics.alarm_raised(LETTER)
    assert metrics.value("sendqueue_sends_total", outcome="sent") == 2
    assert metrics.value("sendqueue_sends_total", outcome="transient") == 1
    assert metrics.value("sendqueue_send_lateness_seconds_count") == 2
    assert metrics.value("sendqueue_send_lateness_seconds_sum") == 1.5
    assert metrics.value("sendqueue_send_lateness_seconds_bucket", le="0.05") == 1
    assert metrics.value("sendqueue_reconciler_repairs_total", kind="stale_retried") == 3
    assert metrics.value("sendqueue_dead_letters_total") == 1
    assert metrics.value("sendqueue_alarms_total") == 1


def test_two_containers_do_not_share_counts() -> None:
    one, two = fake_app(), fake_app()
    one.events.send_finished("sent", 0.0)
    assert _sends(one, "sent") == 1
    assert _sends(two, "sent") == 0
    assert one.metrics.registry is not two.metrics.registry


def test_the_dead_letter_depth_is_read_at_scrape_time_and_kept_while_unknown() -> None:
    depth: list[int | Exception] = [2]

    def read() -> int:
        value = depth[0]
        if isinstance(value, Exception):
            raise value
        return value

    metrics = PrometheusMetrics(dead_letter_depth=read)
    assert b"\nsendqueue_dead_letter_depth 2.0\n" in metrics.render()[0]
    depth[0] = 5
    assert metrics.value("sendqueue_dead_letter_depth") == 5
    depth[0] = SchedulerError("unreachable")
    assert b"\nsendqueue_dead_letter_depth 5.0\n" in metrics.render()[0]


def test_a_sent_task_counts_as_sent_with_its_lateness() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    task = _one_task(app)
    clock.set(task.send_at + timedelta(seconds=3))
    app.worker.send(send_payload(task))
    assert _sends(app, "sent") == 1
    assert app.metrics.value("sendqueue_send_lateness_seconds_sum") == 3.0
    assert _sends(app, "skipped") == 0


def test_every_skipped_invocation_counts_as_skipped() -> None:
    clock = FakeClock(T0)
    app = fake_app(clock=clock)
    task = _one_task(app)
    app.worker.send(send_payload(task))  # early: well before its send time
    assert _sends(app, "skipped") == 1
    clock.set(task.send_at)
    app.worker.send({**send_payload(task), "token": "stale"})
    app.worker.send({"kind": "send", "task_id": "nope-1", "token": "x"})
    assert _sends(app, "skipped") == 3
    app.campaign_controls.pause(task.campaign_id)
    app.worker.send(send_payload(task))  # the campaign is not sending
    assert _sends(app, "skipped") == 4
    app.campaign_controls.resume(task.campaign_id)
    (task,) = app.store.list_tasks(task.campaign_id)
    app.worker.send(send_payload(task))
    assert _sends(app, "sent") == 1
    app.worker.send(send_payload(task))  # already finished
    assert _sends(app, "skipped") == 5
    assert app.mailer.sent and len(app.mailer.sent) == 1  # type: ignore[attr-defined]


def test_given_events_hear_the_worker_and_the_reconciler() -> None:
    clock = FakeClock(T0)
    events = RecordingEvents()
    app = bootstrap(
        Settings(_env_file=None),
        clock=clock,
        store=InMemoryTaskStore(),
        scheduler=FakeScheduler(clock, seed=1),
        mailer=RecordingMailer(),
        events=events,
    )
    task = _one_task(app)
    app.worker.send(send_payload(task))
    clock.set(task.send_at)
    app.scheduler.delete(expected_schedule_name(task))
    assert app.reconciler.run().missing_schedules_created == 1
    app.worker.send(send_payload(task))
    assert events.outcomes == ["skipped", "sent"]
    assert events.repairs == {"missing_schedules_created": 1}
    assert app.store.get_task(task.id).state is TaskState.FINISHED  # type: ignore[union-attr]
    assert _sends(app, "sent") == 0  # the container's registry heard nothing


def test_the_worker_serves_its_metrics_over_http() -> None:
    app = fake_app()
    app.events.send_finished("skipped")
    server = app.serve_metrics(0)
    try:
        assert server.port > 0
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            text = response.read().decode()
    finally:
        server.close()
    assert 'sendqueue_sends_total{outcome="skipped"} 1.0\n' in text
    assert "# TYPE sendqueue_dead_letter_depth gauge\n" in text
    with pytest.raises(urllib.error.URLError, match="refused"):  # closed: the port is free
        urllib.request.urlopen(url, timeout=2)
