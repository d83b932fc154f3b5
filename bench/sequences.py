"""Benchmark 16: sequences (a campaign of 3 steps).

Send throughput: the sends of a 3-step campaign's step 1, each of which also marks the
recipient's step 2 in its finish, which the worker process then makes with the others marked
(its task, its slot under the campaign's lease, its schedule: ``FollowUps.make_due``), against
the sends of a one-step campaign of the same recipients, side by side in one run, alternating,
each in its own child process; the 3-step side's clock runs until the last step 2 is made.
The backlog is benchmark 4's (:mod:`bench.throughput`: all due when the worker starts, sent as
fast as it can); step 2 is due a sending day later, so no step 2 goes out while the clock
runs. The embedded layer on a SQLite store and the procrastinate layer (one worker process,
PostgreSQL).

Provisioning: a 3-step sequence of ``recipients`` (only step 1's tasks are written, by design:
docs/decisions/0007-sequence-steps.md) against the raw insert of the same rows, as benchmark 2
measures a one-step campaign (:mod:`bench.provisioning`), on the SQLite store.

Child entry point: ``python -m bench.sequences send PORT EMAILS CONCURRENCY --steps N ...``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import cpu_seconds, run_child, summarize
from bench.provisioning import _settings as provisioning_settings
from bench.provisioning import _Templates
from bench.throughput import (
    _backlog_policy,
    _dispatching,
    _promote_backlog,
    _settings,
    _ShiftedClock,
)
from sendqueue.domain.policy import Window

__all__ = ["PROVISIONING_TARGET", "THROUGHPUT_TARGET", "run_provisioning", "run_throughput"]

#: A 3-step campaign's sends against a one-step campaign's (the making of step 2 included).
THROUGHPUT_TARGET = 0.8
#: Provisioning a 3-step sequence against the raw insert of the same rows.
PROVISIONING_TARGET = 0.3
#: The steps' number in the benchmark's sequence.
STEPS = 3
SUBJECT = "Hello {{ name }}"
BODY = "Dear {{ name }} in {{ city }}"


def sequence_steps() -> tuple[Any, ...]:
    """Step 1 as benchmark 4's one-step campaign, then two follow-ups a sending day apart."""
    from sendqueue.domain.steps import Step, parse_delay

    later = [
        Step(k, None, f"Step {k}, {{{{ name }}}}: any news?", None, parse_delay("1d"))
        for k in range(2, STEPS + 1)
    ]
    return (Step(1, SUBJECT, BODY, None, None), *later)


def _policy(start: datetime) -> Any:
    """Benchmark 4's backlog policy (all due when the worker starts), its window open an hour
    past now instead of ten minutes: a slow 3-step run must not see its last step 1s moved to
    the next day's window."""
    policy = _backlog_policy(start)
    first = policy.windows[0].start_minute
    end = first + 180
    windows = [Window(first, min(end, 1440))] + ([Window(0, end - 1440)] if end > 1440 else [])
    return replace(policy, windows=tuple(windows))


def _create(app: Any, emails: int, steps: int, start: datetime) -> str:
    from sendqueue.services.campaigns.demo import demo_csv
    from sendqueue.services.importing.recipients import Templates

    how: dict[str, Any] = (
        {"steps": sequence_steps()}
        if steps > 1
        else {"templates": Templates(subject=SUBJECT, body=BODY)}
    )
    return str(
        app.campaign_import.create(
            name=f"sequence {steps}",
            recipients=demo_csv(emails),
            policy=_policy(start),
            **how,
        ).campaign.id
    )


def _sent_times(app: Any, cid: str) -> list[float]:
    """The sent_at of every Finished step-1 task, epoch seconds."""
    from sendqueue.domain.lifecycle import TaskState

    sent: list[float] = []
    after = -1
    while True:
        page = app.store.list_tasks(cid, after=after, limit=5000, step=1)
        sent += [
            t.sent_at.timestamp()
            for t in page
            if t.state is TaskState.FINISHED and t.sent_at is not None
        ]
        if len(page) < 5000:
            return sent
        after = page[-1].position


def _made_times(app: Any, cid: str) -> list[float]:
    """The created_at of every step-2 task, epoch seconds."""
    made: list[float] = []
    after = -1
    while True:
        page = app.store.list_tasks(cid, after=after, limit=5000, step=2)
        made += [t.created_at.timestamp() for t in page]
        if len(page) < 5000:
            return made
        after = page[-1].position


def _wait_made(app: Any, cid: str, deadline: float) -> None:
    """Poll every 0.05 s until no mark is left: every send is recorded by now, so every next
    step is made (the child checks the count after). One index probe a poll: reading the
    steps themselves would take the CPU the worker process is making them with."""
    while app.store.follow_ups_due(cid, limit=1):
        if time.monotonic() > deadline:
            raise AssertionError("the next steps were not all made")
        time.sleep(0.05)


def _wait_finished(app: Any, cid: str, emails: int, deadline: float) -> dict[Any, int]:
    """Poll once a second until ``emails`` tasks are Finished (step 2s stay Pending)."""
    from sendqueue.domain.lifecycle import TaskState

    while True:
        counts = app.store.count_tasks(cid)
        if counts[TaskState.FINISHED] >= emails:
            return dict(counts)
        if counts[TaskState.FAILED] or time.monotonic() > deadline:
            raise AssertionError(f"the sends did not finish: {dict(counts)}")
        time.sleep(1.0)


def child_send(
    store_url: str, home: Path, port: int, emails: int, concurrency: int, execution: str, steps: int
) -> dict[str, Any]:
    """Provision (untimed, on a clock two hours behind) then send the campaign's step 1."""
    from sendqueue.bootstrap import bootstrap
    from sendqueue.domain.lifecycle import TaskState

    settings = _settings(store_url, home, port, concurrency, execution)
    past = _ShiftedClock(timedelta(hours=2))
    planner = bootstrap(settings, clock=past)
    cid = _create(planner, emails, steps, past.now())
    report = planner.provisioner.provision(cid)
    if report.status != "done":
        raise AssertionError(f"provisioning failed: {report}")
    planner.close()

    app = bootstrap(settings)
    app.store.get_campaign(cid)
    _ = app.scheduler, app.mailer
    if execution == "procrastinate":
        _promote_backlog(app, store_url)
    stop = threading.Event()
    worker = _dispatching(app, stop, execution, store_url, concurrency, first=True)
    cpu = cpu_seconds()
    started = datetime.now(UTC)
    worker.start()
    counts = _wait_finished(app, cid, emails, time.monotonic() + 1800)
    if steps > 1:
        _wait_made(app, cid, time.monotonic() + 600)
    cpu = cpu_seconds() - cpu
    sent = _sent_times(app, cid)
    ends = max(sent) if sent else 0.0
    if steps > 1:  # a send's work ends when its next step is made
        ends = max(ends, *_made_times(app, cid))
    stop.set()
    worker.join(60)
    made = app.store.count_tasks(cid)[TaskState.PENDING] if steps > 1 else 0
    app.close()
    if len(sent) != emails:
        raise AssertionError(f"only {len(sent)} of {emails} emails finished: {counts}")
    if steps > 1 and made != emails:
        raise AssertionError(f"{made} next steps made for {emails} sends")
    seconds = ends - started.timestamp()
    return {"seconds": seconds, "per_second": emails / seconds, "cpu_s": cpu, "made": made}


def run_throughput(
    *, emails: int, concurrency: int, repeats: int, port: int, layers: dict[str, tuple[str, ...]]
) -> dict[str, Any]:
    """``layers``: label -> (execution, store URL of the one-step runs, of the 3-step runs);
    ``""`` for a fresh SQLite file per run."""
    out: dict[str, Any] = {
        "emails": emails, "concurrency": concurrency, "repeats": repeats, "steps": STEPS,
        "variants": {}, "targets": [],
    }  # fmt: skip
    for label, (execution, one_url, many_url) in layers.items():
        runs: dict[int, list[dict[str, Any]]] = {1: [], STEPS: []}

        def send(steps: int, url: str, execution: str = execution) -> dict[str, Any]:
            return run_child(
                "bench.sequences", "send", str(port), str(emails), str(concurrency),
                "--store", url, "--execution", execution, "--steps", str(steps),
            )  # fmt: skip

        pair: list[tuple[int, Callable[[], dict[str, Any]]]] = [
            (1, partial(send, 1, one_url)),
            (STEPS, partial(send, STEPS, many_url)),
        ]
        for n in range(repeats):
            for steps, step in pair if n % 2 == 0 else pair[::-1]:
                runs[steps].append(step())
        one = summarize([r["per_second"] for r in runs[1]])
        many = summarize([r["per_second"] for r in runs[STEPS]])
        ratio = many.median / one.median
        out["variants"][label] = {
            "execution": execution,
            "one_step_per_second": one.as_dict(),
            "sequence_per_second": many.as_dict(),
            "one_step_cpu_seconds": summarize([r["cpu_s"] for r in runs[1]]).as_dict(),
            "sequence_cpu_seconds": summarize([r["cpu_s"] for r in runs[STEPS]]).as_dict(),
            "ratio": ratio,
        }
        out["targets"].append(
            {
                "name": f"a {STEPS}-step campaign's sends >= {THROUGHPUT_TARGET:g}x a one-step "
                f"campaign's ({label})",
                "value": ratio,
                "limit": THROUGHPUT_TARGET,
                "unit": "x",
                "passed": ratio >= THROUGHPUT_TARGET,
            }
        )
    return out


class _SequenceTemplates(_Templates):
    """Benchmark 2's imported campaigns, made a 3-step sequence."""

    def template(self, size: int) -> tuple[str, str]:
        if size not in self._made:
            url = f"sqlite:///{self._home / f'sequence-{size}.db'}"
            self._made[size] = (url, _import_sequence(url, self._home, size))
        return self._made[size]


def _import_sequence(store_url: str, home: Path, recipients: int) -> str:
    from sendqueue.bootstrap import bootstrap
    from sendqueue.domain.policy import SendingPolicy
    from sendqueue.services.campaigns.demo import demo_csv

    app = bootstrap(provisioning_settings(store_url, f"sqlite:///{home / 'unused.db'}"))
    try:
        return str(
            app.campaign_import.create(
                name=f"sequence {recipients}",
                recipients=demo_csv(recipients),
                policy=SendingPolicy(timezone="Europe/Berlin", per_day=10_000),
                steps=sequence_steps(),
            ).campaign.id
        )
    finally:
        app.close()


def run_provisioning(*, recipients: int, repeats: int) -> dict[str, Any]:
    """Provisioning the 3-step sequence against the raw insert of the same rows (SQLite)."""
    sq: list[dict[str, Any]] = []
    raw: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sq-bench-seq-") as tmp, ExitStack() as stack:
        templates = _SequenceTemplates(stack, Path(tmp), postgres=False)

        def sendqueue() -> None:
            url, scheduler, cid = templates.fresh(recipients)
            sq.append(run_child("bench.provisioning", "sendqueue", url, f"sqlite:///{scheduler}",
                                cid))  # fmt: skip

        def baseline() -> None:
            url, scheduler, cid = templates.fresh(recipients)
            raw.append(run_child("bench.provisioning", "raw", url, scheduler, cid))

        for n in range(repeats):
            for step in (sendqueue, baseline) if n % 2 == 0 else (baseline, sendqueue):
                step()
    if any(r["tasks"] != recipients for r in sq):
        raise AssertionError(f"not one task per recipient: {[r['tasks'] for r in sq]}")
    sq_rate = summarize([recipients / r["seconds"] for r in sq])
    raw_rate = summarize([recipients / r["seconds"] for r in raw])
    ratio = sq_rate.median / raw_rate.median
    return {
        "store": "SQLite",
        "recipients": recipients,
        "steps": STEPS,
        "repeats": repeats,
        "sendqueue_per_second": sq_rate.as_dict(),
        "raw_per_second": raw_rate.as_dict(),
        "ratio": ratio,
        "targets": [
            {
                "name": f"provisioning a {STEPS}-step sequence >= {PROVISIONING_TARGET:g}x raw "
                "inserts (SQLite store)",
                "value": ratio,
                "limit": PROVISIONING_TARGET,
                "unit": "x",
                "passed": ratio >= PROVISIONING_TARGET,
            }
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sequences")
    parser.add_argument("side", choices=["send"])
    parser.add_argument("port", type=int)
    parser.add_argument("emails", type=int)
    parser.add_argument("concurrency", type=int)
    parser.add_argument("--store", default="")
    parser.add_argument("--execution", choices=["embedded", "procrastinate"], default="embedded")
    parser.add_argument("--steps", type=int, choices=[1, STEPS], default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sq-bench-seq-send-") as tmp:
        home = Path(tmp)
        url = args.store or f"sqlite:///{home / 'store.db'}"
        result = child_send(
            url, home, args.port, args.emails, args.concurrency, args.execution, args.steps
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
