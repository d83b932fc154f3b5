"""Crash safety: worker processes SIGKILLed after the claim, and after the SMTP accept but
before Finished, then restarted; the reconciler recovers the stale tasks.

- policy ``retry``: no email is lost (one may arrive twice: the one killed after the accept);
- policy ``fail``: no email is sent twice (the killed ones end Failed, "outcome unknown");
- in both, every task ends in a final state.
"""

from __future__ import annotations

import os
import random
import signal
from collections import Counter
from pathlib import Path

import pytest

from sendqueue.domain.lifecycle import TaskState
from sendqueue.services.campaigns.demo import demo_csv, demo_policy
from sendqueue.services.importing.recipients import Templates
from tests.support import worker_proc
from tests.support.real import all_final, real_app, wait_until
from tests.support.smtp import SmtpSink

ROOT = Path(__file__).resolve().parents[2]
COUNT = 12

pytestmark = pytest.mark.slow


def _env(tmp_path: Path, sink: SmtpSink, policy: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDQUEUE_")}
    env.update(
        SENDQUEUE_DATABASE_URL=f"sqlite:///{tmp_path / 'store.db'}",
        SENDQUEUE_SCHEDULER_URL=f"sqlite:///{tmp_path / 'scheduler.db'}",
        SENDQUEUE_MAILER=sink.url(),
        SENDQUEUE_STALE_POLICY=policy,
        # long enough that the first victim's task is not yet recovered (and claimed again)
        # when the second victim starts, even on a loaded machine
        SENDQUEUE_STALE_AFTER="8",
        SENDQUEUE_RECONCILE_INTERVAL="1",
        SENDQUEUE_RECONCILE_LEASE="2",
        SENDQUEUE_SCHEDULER_LEASE="3",
        SENDQUEUE_RETRY_BACKOFF="0.5",
        # the code under test first (a worktree), then the tests package
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    )
    return env


def _kill_at(env: dict[str, str], point: str, nth: int) -> str:
    proc = worker_proc.start(env, "--hold-at", point, "--nth", str(nth))
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line[:2] == ["HOLD", point], line
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    return line[2]


@pytest.mark.parametrize("policy", ["retry", "fail"])
def test_killed_workers_lose_nothing_under_retry_and_duplicate_nothing_under_fail(
    tmp_path: Path, smtp_sink: SmtpSink, policy: str
) -> None:
    rng = random.Random(f"crash-{policy}")
    env = _env(tmp_path, smtp_sink, policy)
    app = real_app(tmp_path, smtp_sink.url(), stale_policy=policy, stale_after=8)
    cid = app.campaign_import.create(
        name="crash",
        recipients=demo_csv(COUNT),
        policy=demo_policy(app.clock.now(), "UTC", COUNT, 0.3),
        templates=Templates(subject="s {{ name }}", body="b"),
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"

    def running() -> set[str]:
        return {t.id for t in app.store.list_tasks(cid, state=TaskState.RUNNING, limit=100)}

    # every task Running when a process dies was in flight there (4 sends run at once)
    claimed = _kill_at(env, "claim", rng.randint(1, 3))
    in_flight = running()
    accepted = _kill_at(env, "accepted", rng.randint(1, 3))
    in_flight |= running()
    assert claimed != accepted and {claimed, accepted} <= in_flight

    final = worker_proc.start(env)  # no kill point: it recovers the stale tasks and sends the rest
    try:
        wait_until(lambda: all_final(app, cid), 90, "every task final")
    finally:
        final.send_signal(signal.SIGTERM)
        out, _ = final.communicate(timeout=30)
    assert final.returncode == 0 and "STOPPED" in out

    tasks = {t.id: t for t in app.store.list_tasks(cid, limit=100)}
    assert all(t.state.is_final for t in tasks.values())
    received = Counter(m.rcpt_tos[0] for m in smtp_sink.messages)
    by_email = {t.email: t for t in tasks.values()}
    if policy == "retry":
        assert set(received) == set(by_email), "an email was lost"
        assert all(t.state is TaskState.FINISHED for t in tasks.values())
        # duplicates only where a worker died after the provider accepted the email
        assert {e for e, n in received.items() if n > 1} <= {tasks[i].email for i in in_flight}
        assert received[tasks[accepted].email] == 2
        assert received[tasks[claimed].email] == 1
    else:
        assert max(received.values()) == 1, "an email was sent twice"
        for tid in in_flight:
            assert tasks[tid].state is TaskState.FAILED
            assert "outcome unknown" in (tasks[tid].error or "")
        assert received[tasks[accepted].email] == 1  # it did go out, once
        assert tasks[claimed].email not in received
        others = [t for tid, t in tasks.items() if tid not in in_flight]
        assert others and all(t.state is TaskState.FINISHED for t in others)
    app.close()
