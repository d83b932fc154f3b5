"""Sequences survive a worker SIGKILLed between a step's send and its next step: on the
embedded layer (SQLite) and on procrastinate (PostgreSQL), real ``sendqueue worker``
processes send a three-step sequence into an aiosmtpd sink; the victim dies right after the
sink accepted step 1 (before step 1 is recorded Finished, so before its next step is marked)
or right after step 2's task was stored by the process's follow-up runner (step 1 recorded
Finished and marked; step 2 not yet scheduled, the mark not yet cleared).

Killed at the accept, under the ``retry`` stale policy the restarted worker's reconciler sends
step 1 again (it was never recorded: the one duplicate the policy allows), and the
recipient's step 2 exists once and goes out once, in the thread of the recorded step 1; step
3 is then made once. Under ``fail``, step 1 ends Failed ("outcome unknown") and the sequence
stops there: no later step is made for that recipient. Killed after step 2 was stored, step 1
went out once and stays recorded (under either policy): the restarted worker's reconciler
finds the mark, sees step 2 made and schedules it, and it goes out once. A step's delay (a
minute at least) is cut short by moving its task to now, as the passing of time would.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest

from sendqueue.adapters.procrastinate.schema import upgrade_schema
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import Task, task_id
from sendqueue.domain.steps import Step, parse_delay
from sendqueue.domain.transitions import move
from sendqueue.services.campaigns.demo import demo_policy
from sendqueue.settings import Settings
from tests.support import worker_proc
from tests.support.real import wait_until
from tests.support.smtp import ReceivedMail, SmtpSink

ROOT = Path(__file__).resolve().parents[2]
STEPS = (
    Step(1, "Hello {{ name }}", "Dear {{ name }}\n", None, None),
    Step(2, None, "Any thoughts, {{ name }}?\n", None, parse_delay("1m")),
    Step(3, None, "Last note, {{ name }}.\n", None, parse_delay("1m")),
)
ROWS = b"email,name\nann@example.com,Ann\nbob@example.com,Bob\n"
#: Short stale and reconcile periods, so the victim's Running step 1 is recovered in seconds.
TIMING = {
    "SENDQUEUE_STALE_AFTER": "4",
    "SENDQUEUE_RECONCILE_INTERVAL": "1",
    "SENDQUEUE_RECONCILE_LEASE": "2",
    "SENDQUEUE_SCHEDULER_LEASE": "3",
    "SENDQUEUE_RETRY_BACKOFF": "0.5",
}

pytestmark = pytest.mark.slow


def _env(database: str, sink: SmtpSink, policy: str, **layer: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDQUEUE_")}
    env.update(TIMING)
    env.update(layer)
    env.update(
        SENDQUEUE_DATABASE_URL=database,
        SENDQUEUE_MAILER=sink.url(),
        SENDQUEUE_STALE_POLICY=policy,
        # the code under test first (a worktree), then the tests package
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    )
    return env


def _app(env: dict[str, str]) -> Container:
    """The test's own container on the workers' store and execution layer."""
    fields = {
        key.removeprefix("SENDQUEUE_").lower(): value
        for key, value in env.items()
        if key.startswith("SENDQUEUE_")
    }
    return bootstrap(Settings(_env_file=None, **fields))  # type: ignore[arg-type]


def _kill_at(env: dict[str, str], point: str) -> str:
    """A worker held at the first ``point``, SIGKILLed there; the task id it held on."""
    proc = worker_proc.start(env, "--hold-at", point, "--nth", "1")
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line[:2] == ["HOLD", point], line
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    return line[2]


@contextmanager
def _worker(env: dict[str, str]) -> Iterator[None]:
    proc = worker_proc.start(env)
    try:
        yield
    finally:
        worker_proc.stop(proc)


def _tasks(app: Container, cid: str) -> dict[str, Task]:
    return {t.id: t for t in app.store.list_tasks(cid, limit=100)}


def _step_of(app: Container, cid: str, step: int) -> list[Task]:
    return [t for t in _tasks(app, cid).values() if t.step == step]


def _sent(sink: SmtpSink, task: str) -> list[ReceivedMail]:
    return [m for m in sink.messages if m["X-Sendqueue-Task"] == task]


def _due_now(app: Container, tasks: list[Task]) -> None:
    """The tasks' delay has passed: each moved to now and scheduled there."""
    now = app.clock.now()
    assert app.store.reschedule([move(t, now) for t in tasks], at=now, reason="delay over")
    moved = app.store.get_tasks([t.id for t in tasks])
    assert not app.writer.ensure_many(list(moved.values())).failed


def _created(app: Container) -> str:
    cid = app.campaign_import.create(
        name="seq-kill",
        recipients=ROWS,
        policy=demo_policy(app.clock.now(), "UTC", 300, 1.0),  # a send a second, 8 minutes
        steps=STEPS,
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    return cid


def _scenario(env: dict[str, str], sink: SmtpSink, point: str, policy: str) -> None:
    app = _app(env)
    try:
        cid = _created(app)
        # one send at a time: the victim dies on the first recipient's, before the other's
        held = app.store.get_task(_kill_at({**env, "SENDQUEUE_WORKER_CONCURRENCY": "1"}, point))
        assert held is not None
        victim = task_id(cid, held.position, 1)
        assert len(_sent(sink, victim)) == 1  # it went out
        if point == "made":
            _made_at_the_kill(app, cid, victim, held)
        else:  # it was never recorded
            assert app.store.get_task(victim).state is TaskState.RUNNING  # type: ignore[union-attr]
        with _worker(env):
            if point == "made" or policy == "retry":
                _retried(app, sink, cid, victim, copies=2 if point == "accepted" else 1)
            else:
                _failed(app, sink, cid, victim)
    finally:
        app.close()


def _made_at_the_kill(app: Container, cid: str, victim: str, held: Task) -> None:
    """Step 1 recorded sent and still marked; its step 2 stored Pending, not yet scheduled."""
    sent = app.store.get_task(victim)
    assert sent is not None and sent.state is TaskState.FINISHED
    assert victim in {t.id for t in app.store.follow_ups_due(cid, limit=10)}
    assert held.step == 2 and held.state is TaskState.PENDING


def _retried(app: Container, sink: SmtpSink, cid: str, victim: str, *, copies: int) -> None:
    wait_until(lambda: len(_step_of(app, cid, 2)) == 2, 40, "both step 2s made")
    wait_until(
        lambda: all(t.state is TaskState.FINISHED for t in _step_of(app, cid, 1)),
        40,
        "step 1 recorded sent",
    )
    # the stale policy's one duplicate of a send never recorded; none of a recorded one
    assert len(_sent(sink, victim)) == copies
    # step 2 waits for its delay after the recorded step 1 (a restart re-plans the campaign)
    sent_at = {t.position: t.sent_at for t in _step_of(app, cid, 1)}
    for waiting in _step_of(app, cid, 2):
        when = sent_at[waiting.position]
        assert when is not None and waiting.send_at >= when + timedelta(minutes=1)
        assert waiting.state is TaskState.PENDING and not _sent(sink, waiting.id)
    _due_now(app, _step_of(app, cid, 2))
    wait_until(lambda: len(_step_of(app, cid, 3)) == 2, 40, "both step 3s made")
    wait_until(
        lambda: all(t.state is TaskState.FINISHED for t in _step_of(app, cid, 2)),
        40,
        "step 2 recorded sent",
    )
    firsts = {t.position: t for t in _step_of(app, cid, 1)}
    for second in _step_of(app, cid, 2):
        [mail] = _sent(sink, second.id)  # exactly once
        assert mail["In-Reply-To"] == firsts[second.position].message_id
        assert mail["Subject"] == f"Re: {firsts[second.position].subject}"
    third = _step_of(app, cid, 3)
    assert [t.state for t in third] == [TaskState.PENDING] * 2
    assert not [m for t in third for m in _sent(sink, t.id)]  # due a minute later
    assert len(_tasks(app, cid)) == 6


def _failed(app: Container, sink: SmtpSink, cid: str, victim: str) -> None:
    wait_until(
        lambda: app.store.get_task(victim).state is TaskState.FAILED,  # type: ignore[union-attr]
        40,
        "the victim's step 1 failed",
    )
    done = app.store.get_task(victim)
    assert done is not None and "outcome unknown" in (done.error or "")
    assert len(_sent(sink, victim)) == 1  # never twice under "fail"
    other = next(t for t in _step_of(app, cid, 1) if t.id != victim)
    wait_until(lambda: len(_step_of(app, cid, 2)) >= 1, 40, "the other's step 2 made")
    _due_now(app, _step_of(app, cid, 2))
    wait_until(lambda: all(t.state.is_final for t in _step_of(app, cid, 2)), 40, "step 2 final")
    # reconciler passes ran meanwhile (every second): none made a step 2 for the victim
    [second] = _step_of(app, cid, 2)
    assert second.position == other.position
    assert second.state is TaskState.FINISHED and len(_sent(sink, second.id)) == 1


@pytest.mark.parametrize(
    ("point", "policy"), [("accepted", "retry"), ("accepted", "fail"), ("made", "fail")]
)
def test_a_worker_killed_between_a_step_and_the_next_sends_the_next_once_on_sqlite(
    tmp_path: Path, smtp_sink: SmtpSink, point: str, policy: str
) -> None:
    env = _env(
        f"sqlite:///{tmp_path / 'store.db'}",
        smtp_sink,
        policy,
        SENDQUEUE_SCHEDULER_URL=f"sqlite:///{tmp_path / 'scheduler.db'}",
    )
    _scenario(env, smtp_sink, point, policy)


@pytest.mark.postgres
@pytest.mark.parametrize(("point", "policy"), [("accepted", "retry"), ("made", "retry")])
def test_a_worker_killed_between_a_step_and_the_next_sends_the_next_once_on_procrastinate(
    postgres_url: str, smtp_sink: SmtpSink, point: str, policy: str
) -> None:
    upgrade_schema(postgres_url)
    env = _env(postgres_url, smtp_sink, policy, SENDQUEUE_EXECUTION="procrastinate")
    _scenario(env, smtp_sink, point, policy)
