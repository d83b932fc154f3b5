"""The fire loop of the procrastinate layer (``adapters/procrastinate/firing.py``) on PostgreSQL:

- due jobs fire once each, not before their instant, in due order, and are deleted;
- a job claimed ahead of its due instant and deleted meanwhile does not fire;
- a stop gives claimed jobs that did not start back (waiting again, no attempt counted) and
  removes the worker row;
- a failing invocation is retried with backoff from the fire loop too;
- a fire thread that ends a job starts the next due held one itself, without a dispatcher
  round;
- the jobs a loop holds beyond the running ones stay within what its threads start within
  ``claim_ahead``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from sendqueue.adapters.clock import SystemClock
from sendqueue.adapters.procrastinate.firing import FireLoop
from sendqueue.adapters.procrastinate.scheduler import ProcrastinateScheduler
from sendqueue.adapters.procrastinate.schema import conninfo_from_url
from sendqueue.ports import Target
from tests.support.real import wait_until

pytestmark = [pytest.mark.postgres]


def _query(url: str, sql: str, *params: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(conninfo_from_url(url), autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def _local(seconds: float) -> datetime:
    return (SystemClock().now() + timedelta(seconds=seconds)).replace(tzinfo=None)


@contextmanager
def _running(
    scheduler: ProcrastinateScheduler, target: Target, **loop: Any
) -> Iterator[threading.Event]:
    """The scheduler's dispatcher, or (``loop``: options of FireLoop, ``concurrency`` 2 unless
    given) a bare fire loop, running on a thread until the block ends."""
    stop = threading.Event()
    if not loop:
        thread = threading.Thread(target=scheduler.run, args=(target, stop), daemon=True)
    else:
        worker = scheduler._worker
        fire_loop = FireLoop(
            worker.jobs,
            lambda job: worker._run_fire_job(job, target),
            conninfo=conninfo_from_url(scheduler.url),
            clock=scheduler.clock,
            poll_interval=0.2,
            heartbeat_interval=1.0,
            connect_timeout=5.0,
            shutdown_timeout=5.0,
            **{"concurrency": 2, **loop},
        )
        thread = threading.Thread(target=fire_loop.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive(), "the fire loop did not stop"


def test_due_jobs_fire_once_each_at_their_instant_in_due_order_and_are_deleted(
    postgres_url: str,
) -> None:
    scheduler = ProcrastinateScheduler(postgres_url, poll_interval=0.5, reconcile_interval=None)
    fired: dict[str, float] = {}
    lock = threading.Lock()

    def target(payload: Mapping[str, str]) -> None:
        with lock:
            assert payload["task_id"] not in fired, "fired twice"
            fired[payload["task_id"]] = time.time()

    due: dict[str, float] = {}
    with _running(scheduler, target):
        for i in range(40):
            made = scheduler.create(f"sq-{i}", "g", _local(1.0 + i * 0.05), "UTC",
                                    {"task_id": str(i)}, "tok")  # fmt: skip
            due[str(i)] = made.due_at.timestamp()
        wait_until(lambda: len(fired) == 40, 30, "every schedule fired")
        wait_until(
            lambda: _query(postgres_url, "SELECT count(*) FROM procrastinate_jobs "
                           "WHERE task_name = 'sendqueue.fire'") == [(0,)],
            10, "the fired jobs deleted",
        )  # fmt: skip
    assert all(fired[i] >= due[i] for i in due), "a schedule fired before its instant"
    assert sorted(fired, key=fired.__getitem__)[:5] == ["0", "1", "2", "3", "4"]
    assert _query(postgres_url, "SELECT count(*) FROM procrastinate_workers") == [(0,)]
    scheduler.close()


def test_a_job_claimed_ahead_then_deleted_before_its_instant_does_not_fire(
    postgres_url: str,
) -> None:
    scheduler = ProcrastinateScheduler(postgres_url, reconcile_interval=None)
    fired: list[str] = []
    scheduler.create("sq-kept", "g", _local(3), "UTC", {"task_id": "kept"}, "tok")
    scheduler.create("sq-gone", "g", _local(3), "UTC", {"task_id": "gone"}, "tok")
    with _running(scheduler, lambda p: fired.append(p["task_id"]), lookahead=30):
        wait_until(
            lambda: _query(postgres_url, "SELECT count(*) FROM procrastinate_jobs "
                           "WHERE status = 'doing'") == [(2,)],
            10, "both claimed ahead",
        )  # fmt: skip
        scheduler.delete("sq-gone")
        assert scheduler.get("sq-gone") is None
        wait_until(lambda: fired == ["kept"], 10, "the kept one fired")
        wait_until(
            lambda: _query(postgres_url, "SELECT count(*) FROM procrastinate_jobs") == [(0,)],
            10, "both jobs deleted",
        )  # fmt: skip
    assert fired == ["kept"]
    scheduler.close()


def test_a_stop_gives_claimed_jobs_back_without_counting_an_attempt(postgres_url: str) -> None:
    scheduler = ProcrastinateScheduler(postgres_url, reconcile_interval=None)
    made = scheduler.create("sq-later", "g", _local(60), "UTC", {"task_id": "later"}, "tok")
    with _running(scheduler, lambda p: None, lookahead=120):
        wait_until(
            lambda: _query(postgres_url, "SELECT status FROM procrastinate_jobs") == [("doing",)],
            10, "claimed ahead",
        )  # fmt: skip
    rows = _query(postgres_url, "SELECT status, attempts, worker_id FROM procrastinate_jobs")
    assert rows == [("todo", 0, None)]
    assert _query(postgres_url, "SELECT count(*) FROM procrastinate_workers") == [(0,)]
    assert scheduler.get("sq-later") == made
    scheduler.close()


def test_a_failing_invocation_is_retried_with_backoff_by_the_fire_loop(postgres_url: str) -> None:
    scheduler = ProcrastinateScheduler(postgres_url, retry_backoff=0.5, reconcile_interval=None)
    calls: list[float] = []

    def flaky(payload: Mapping[str, str]) -> None:
        calls.append(time.time())
        if len(calls) == 1:
            raise RuntimeError("the store is down")

    scheduler.create("sq-flaky", "g", _local(0), "UTC", {"task_id": "flaky"}, "tok")
    with _running(scheduler, flaky):
        wait_until(lambda: len(calls) == 2, 20, "the retry")
        wait_until(
            lambda: _query(postgres_url, "SELECT count(*) FROM procrastinate_jobs") == [(0,)],
            10, "the job deleted after its retry succeeded",
        )  # fmt: skip
    assert calls[1] - calls[0] >= 0.25  # backoff 0.5 s, jittered
    assert scheduler.dead_letters() == []
    scheduler.close()


def test_a_fire_thread_that_ends_a_job_starts_the_next_due_held_one_itself(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One thread, every claim after the first held up: the job held ahead by the first claim
    still fires when the first job ends (before, the dispatcher handed it over after its next
    round, so it waited for the held-up claim)."""
    scheduler = ProcrastinateScheduler(postgres_url, reconcile_interval=None)
    jobs = scheduler._worker.jobs
    claim = jobs.settle_and_claim
    rounds: list[int] = []
    gate = threading.Event()

    def held_up(*args: Any, **kwargs: Any) -> Any:
        rounds.append(kwargs["limit"])
        if len(rounds) > 1:
            gate.wait(20)
        return claim(*args, **kwargs)

    monkeypatch.setattr(jobs, "settle_and_claim", held_up)
    for i in range(4):
        scheduler.create(f"sq-{i}", "g", _local(-1 + i * 0.01), "UTC", {"task_id": str(i)}, "t")
    fired: list[str] = []

    def target(payload: Mapping[str, str]) -> None:
        time.sleep(0.1)  # the dispatcher is asleep (or in its next round) when it ends
        fired.append(payload["task_id"])

    try:
        with _running(scheduler, target, concurrency=1):
            wait_until(lambda: len(rounds) > 1, 10, "a second claim, held up")
            assert rounds[0] == 2  # the idle thread and one job ahead
            wait_until(lambda: fired == ["0", "1"], 10, "the held job fired without a round")
            gate.set()
            wait_until(lambda: len(fired) == 4, 10, "the rest fired after the round")
    finally:
        gate.set()
    assert fired == ["0", "1", "2", "3"]
    scheduler.close()


def test_a_base_exception_in_one_job_does_not_stall_the_jobs_after_it(postgres_url: str) -> None:
    """A SystemExit out of a job ends that thread's turn: the next held job is not taken by
    it (it would be lost, and the thread counted as running for good), the others fire."""
    scheduler = ProcrastinateScheduler(postgres_url, reconcile_interval=None)
    for i in range(4):
        scheduler.create(f"sq-{i}", "g", _local(-1 + i * 0.01), "UTC", {"task_id": str(i)}, "t")
    fired: list[str] = []

    def target(payload: Mapping[str, str]) -> None:
        time.sleep(0.05)
        if payload["task_id"] == "0":
            raise SystemExit("a library called sys.exit")
        fired.append(payload["task_id"])

    with _running(scheduler, target, concurrency=1):
        wait_until(lambda: len(fired) == 3, 10, "the jobs after the SystemExit fired")
    assert fired == ["1", "2", "3"]
    scheduler.close()


def test_the_jobs_held_ahead_stay_within_what_the_threads_start_in_claim_ahead(
    postgres_url: str,
) -> None:
    """2 threads, jobs of 0.25 s, claim_ahead 0.1 s: the threads start 0.8 jobs in 0.1 s, so a
    loop holds at most one claimed job beyond the two running ones (before: two, whatever the
    job time). Jobs whose target returned but are not deleted yet are not counted."""
    scheduler = ProcrastinateScheduler(postgres_url, reconcile_interval=None)
    for i in range(16):
        scheduler.create(f"sq-{i}", "g", _local(-1), "UTC", {"task_id": str(i)}, "t")
    ended: set[str] = set()

    def slow(payload: Mapping[str, str]) -> None:
        time.sleep(0.25)
        ended.add(payload["task_id"])

    in_hand: list[int] = []
    with _running(scheduler, slow, claim_ahead=0.1):
        wait_until(lambda: len(ended) >= 3, 10, "a few jobs timed")
        while len(ended) < 12:
            doing = _query(
                postgres_url,
                "SELECT args->'payload'->>'task_id' FROM procrastinate_jobs WHERE status = 'doing'",
            )
            in_hand.append(len({row[0] for row in doing} - ended))
            time.sleep(0.01)
        wait_until(lambda: len(ended) == 16, 10, "every job fired")
    assert max(in_hand) == 3, in_hand  # 2 running + 1 ahead
    scheduler.close()
