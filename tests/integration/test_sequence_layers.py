"""A 3-step sequence end to end on real parts, in real time ("1m" delays), every step sent once:

- the embedded layer (a dispatcher thread) with a SQLite store and with a PostgreSQL store;
- the procrastinate layer: a ``sendqueue worker`` process on PostgreSQL.

Each worker marks a recipient's next step when it sends one, and its process makes the marked
steps within the default linger; the SMTP sink sees every step of every recipient
exactly once, the later ones in step 1's thread.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from sendqueue.bootstrap import Container
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import task_id
from sendqueue.domain.steps import Step, parse_delay
from tests.integration.test_procrastinate import _app, _env, _fleet
from tests.support.app import open_policy
from tests.support.real import real_app, running_worker, wait_until
from tests.support.smtp import SmtpSink

pytestmark = pytest.mark.slow

COUNT = 3
ROWS = ("email,name\n" + "".join(f"r{i}@example.com,R {i}\n" for i in range(COUNT))).encode()
STEPS = (
    Step(1, "Hello {{ name }}", "Hi {{ name }}\n", None, None),
    Step(2, None, "Any news, {{ name }}?\n", None, parse_delay("1m")),
    Step(3, "Last note", "Bye {{ name }}\n", None, parse_delay("1m")),
)
#: Two 1-minute waits, the slots between sends, and the workers' start.
TIMEOUT = 240


def _sequence(app: Container) -> str:
    cid = app.campaign_import.create(
        name="seq",
        recipients=ROWS,
        policy=open_policy(app.clock.now() - timedelta(minutes=1), per_day=10_000),
        from_addr="news@example.com",
        steps=STEPS,
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    return cid


def _done(app: Container, cid: str) -> bool:
    return app.store.get_campaign(cid).state is CampaignState.COMPLETED


def _every_step_once(app: Container, cid: str, sink: SmtpSink) -> None:
    tasks = app.store.list_tasks(cid, limit=100)
    assert Counter((t.step, t.state) for t in tasks) == {
        (k, TaskState.FINISHED): COUNT for k in (1, 2, 3)
    }
    got = Counter(m["X-Sendqueue-Task"] for m in sink.messages)
    assert got == Counter({t.id: 1 for t in tasks}), "a step was lost or sent twice"
    mail = {m["X-Sendqueue-Task"]: m for m in sink.messages}
    for position in range(COUNT):
        first, second, third = (app.store.get_task(task_id(cid, position, k)) for k in (1, 2, 3))
        assert first is not None and second is not None and third is not None
        assert first.sent_at and second.sent_at and third.sent_at
        assert second.sent_at >= first.sent_at + timedelta(minutes=1)
        assert third.sent_at >= second.sent_at + timedelta(minutes=1)
        assert mail[second.id]["Subject"] == f"Re: Hello R {position}"
        assert mail[second.id]["In-Reply-To"] == first.message_id
        assert mail[third.id]["References"] == f"{first.message_id} {second.message_id}"


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_a_sequence_on_the_embedded_layer_sends_every_step_once(
    store: str, tmp_path: Path, smtp_sink: SmtpSink, request: pytest.FixtureRequest
) -> None:
    extra = {"database_url": request.getfixturevalue("postgres_url")} if store == "postgres" else {}
    app = real_app(tmp_path, smtp_sink.url(), **extra)
    cid = _sequence(app)
    with running_worker(app):
        wait_until(lambda: _done(app, cid), TIMEOUT, "the sequence to complete")
    _every_step_once(app, cid, smtp_sink)
    app.close()


@pytest.mark.postgres
def test_a_sequence_on_procrastinate_sends_every_step_once(
    tmp_path: Path, postgres_url: str, smtp_sink: SmtpSink
) -> None:
    app = _app(postgres_url, smtp_sink.url())
    cid = _sequence(app)
    with _fleet(tmp_path, postgres_url, [_env(postgres_url, smtp_sink.url())]) as workers:
        wait_until(lambda: _done(app, cid), TIMEOUT, "the sequence to complete")
        logs = workers.logs()
    assert "Traceback" not in logs
    _every_step_once(app, cid, smtp_sink)
    assert app.scheduler.dead_letters() == []
    app.close()
