"""Soak: campaigns run continuously through real worker processes into an SMTP sink, with
injected SMTP faults and worker kills. It reports throughput, lateness, worker RSS over time,
and every invariant violation, and exits 1 if there was any.

    python -m tests.soak.soak --duration 600 [--policy retry|fail] [--json report.json]

Two ``sendqueue worker`` processes share the SQLite store and scheduler files: a stable one,
whose RSS is sampled to show it stays flat, and a victim that is SIGKILLed at random moments and
restarted. The sink answers a share of messages with 451 (transient) and a few with 550
(permanent). Invariants checked at the end, after a drain:

- every task is final;
- ``retry``: nothing lost: every task that did not fail permanently reached the sink;
- ``fail``: nothing sent twice;
- no email arrived before its send time;
- replaying the change log gives the stored counts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller

from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.models import expected_schedule_name
from sendqueue.services.campaigns.demo import demo_csv, demo_policy
from sendqueue.services.importing.recipients import Templates
from sendqueue.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
#: After warm-up the stable worker's RSS may wobble, not grow: more than this is a violation.
RSS_GROWTH_LIMIT_KB = 30 * 1024
RSS_WARM_UP_S = 60.0


class FaultySink:
    """An SMTP handler that records what it accepts and refuses a share of messages."""

    def __init__(self, transient: float, permanent: float, seed: int) -> None:
        self.transient = transient
        self.permanent = permanent
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.accepted: list[tuple[str, str, float]] = []  # (task id, rcpt, time)
        self.refused_permanently: set[str] = set()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        content = envelope.content.decode("utf-8", "replace")
        task_id = next(
            (
                line.split(":", 1)[1].strip()
                for line in content.splitlines()
                if line.lower().startswith("x-sendqueue-task:")
            ),
            "?",
        )
        with self.lock:
            roll = self.rng.random()
            if roll < self.permanent:
                self.refused_permanently.add(task_id)
                return "550 5.7.1 injected permanent refusal"
            if roll < self.permanent + self.transient:
                return "451 4.3.0 injected transient failure"
            self.accepted.append((task_id, envelope.rcpt_tos[0], time.time()))
        return "250 OK"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


@dataclass
class Report:
    duration_s: float = 0.0
    policy: str = "retry"
    campaigns: int = 0
    tasks: int = 0
    sent: int = 0
    duplicates: int = 0
    failed: int = 0
    kills: int = 0
    throughput_per_s: float = 0.0
    lateness_p50_ms: float = 0.0
    lateness_p99_ms: float = 0.0
    lateness_max_ms: float = 0.0
    rss_kb: list[tuple[float, int]] = field(default_factory=list)
    rss_growth_kb: int = 0
    violations: list[str] = field(default_factory=list)


class Soak:
    def __init__(self, duration: float, policy: str, seed: int, workdir: Path) -> None:
        self.duration = duration
        self.policy = policy
        self.rng = random.Random(seed)
        self.dir = workdir
        self.sink = FaultySink(transient=0.03, permanent=0.005, seed=seed)
        self.port = _free_port()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SENDQUEUE_")}
        self.env.update(
            SENDQUEUE_DATABASE_URL=f"sqlite:///{workdir / 'store.db'}",
            SENDQUEUE_SCHEDULER_URL=f"sqlite:///{workdir / 'scheduler.db'}",
            SENDQUEUE_MAILER=f"smtp://127.0.0.1:{self.port}?security=none&timeout=10",
            SENDQUEUE_STALE_POLICY=policy,
            SENDQUEUE_STALE_AFTER="4",
            SENDQUEUE_RECONCILE_INTERVAL="2",
            SENDQUEUE_RECONCILE_LEASE="3",
            SENDQUEUE_SCHEDULER_LEASE="3",
            SENDQUEUE_SCHEDULER_RETRY_BACKOFF="0.5",
            SENDQUEUE_RETRY_BACKOFF="1",
            SENDQUEUE_AUTO_PAUSE_AFTER="0",
            PYTHONPATH=str(ROOT / "src"),
        )
        self.report = Report(policy=policy)
        self.campaign_ids: list[str] = []

    def _worker(self) -> subprocess.Popen[bytes]:
        with open(self.dir / "worker.log", "ab") as log:  # the child keeps its own descriptor
            return subprocess.Popen(
                [sys.executable, "-m", "sendqueue.cli", "worker"],
                env=self.env,
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def _app(self) -> Container:
        values: dict[str, Any] = {"_env_file": None}
        for key, value in self.env.items():
            if key.startswith("SENDQUEUE_"):
                values[key.removeprefix("SENDQUEUE_").lower()] = value
        return bootstrap(Settings(**values))

    def run(self) -> Report:
        controller = Controller(self.sink, hostname="127.0.0.1", port=self.port)
        controller.start()
        app = self._app()
        stable = self._worker()
        victim = self._worker()
        started = time.monotonic()
        next_campaign = next_kill = next_sample = started
        try:
            while time.monotonic() - started < self.duration:
                now = time.monotonic()
                if now >= next_campaign:
                    self._new_campaign(app)
                    next_campaign = now + self.rng.uniform(2, 6)
                if now >= next_kill:
                    victim.send_signal(signal.SIGKILL)
                    victim.wait(10)
                    self.report.kills += 1
                    victim = self._worker()
                    next_kill = now + self.rng.uniform(5, 15)
                if now >= next_sample:
                    rss = _rss_kb(stable.pid)
                    if rss is not None:
                        self.report.rss_kb.append((round(now - started, 1), rss))
                    next_sample = now + 5
                if stable.poll() is not None:
                    self.report.violations.append(f"the stable worker died: {stable.returncode}")
                    break
                time.sleep(0.2)
            self._drain(app)
        finally:
            for proc in (stable, victim):
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in (stable, victim):
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    self.report.violations.append("a worker did not stop on SIGTERM")
            controller.stop()
        self.report.duration_s = round(time.monotonic() - started, 1)
        self._check(app)
        app.close()
        return self.report

    def _new_campaign(self, app: Container) -> None:
        count = self.rng.randint(10, 40)
        interval = self.rng.choice([0.1, 0.2, 0.5])
        cid = app.campaign_import.create(
            name=f"soak {len(self.campaign_ids)}",
            recipients=demo_csv(count, domain=f"c{len(self.campaign_ids)}.example.com"),
            policy=demo_policy(app.clock.now(), "Europe/Berlin", count, interval),
            templates=Templates(subject="Soak {{ name }}", body="Hello {{ name }}"),
        ).campaign.id
        app.provisioner.provision(cid)
        self.campaign_ids.append(cid)

    def _active(self, app: Container) -> int:
        return sum(
            c[TaskState.PENDING] + c[TaskState.RUNNING]
            for c in (app.store.count_tasks(cid) for cid in self.campaign_ids)
        )

    def _drain(self, app: Container) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self._active(app):
            time.sleep(0.5)
        if self._active(app):
            self.report.violations.append(f"{self._active(app)} tasks not final after the drain")

    def _check(self, app: Container) -> None:
        r = self.report
        accepted = self.sink.accepted
        by_task = Counter(task_id for task_id, _, _ in accepted)
        first_accept: dict[str, float] = {}
        for task_id, _, at in accepted:
            first_accept.setdefault(task_id, at)
        late: list[float] = []
        for cid in self.campaign_ids:
            tasks = app.store.list_tasks(cid, limit=1000)
            r.campaigns += 1
            r.tasks += len(tasks)
            for t in tasks:
                if not t.state.is_final:
                    schedule = app.scheduler.get(expected_schedule_name(t))
                    r.violations.append(
                        f"{t.id} ended {t.state.value} (attempts {t.attempts}, send_at "
                        f"{t.send_at.isoformat()}, claimed {t.claimed_at}, schedule "
                        f"{'present' if schedule else 'missing'}, campaign "
                        f"{app.store.get_campaign(cid).state.value}, error {t.error})"
                    )
                if t.state is TaskState.FAILED:
                    r.failed += 1
                if t.id in first_accept:
                    sent = first_accept[t.id]
                    if sent < t.send_at.timestamp() - 1.0:
                        r.violations.append(f"{t.id} arrived before its send time")
                    late.append(sent - t.send_at.timestamp())
                elif (
                    self.policy == "retry"
                    and t.id not in self.sink.refused_permanently
                    and t.state is not TaskState.CANCELLED
                ):
                    r.violations.append(f"{t.id} was lost ({t.state.value}: {t.error})")
            states: dict[str, str] = {}
            for entry in app.store.changes_after(0, campaign_id=cid, limit=100_000):
                if entry.task_id:
                    states[entry.task_id] = entry.to_state
            stored = {s.value: n for s, n in app.store.count_tasks(cid).items()}
            replayed = Counter(states.values())
            if {k: replayed.get(k, 0) for k in stored} != stored:
                r.violations.append(
                    f"{cid}: change log replays to {dict(replayed)}, store {stored}"
                )
        r.sent = len(by_task)
        r.duplicates = sum(n - 1 for n in by_task.values() if n > 1)
        if self.policy == "fail" and r.duplicates:
            r.violations.append(f"{r.duplicates} emails sent twice under the fail policy")
        r.throughput_per_s = round(len(accepted) / max(r.duration_s, 1e-9), 2)
        if late:
            ordered = sorted(late)
            r.lateness_p50_ms = round(statistics.median(ordered) * 1000, 1)
            r.lateness_p99_ms = round(ordered[int(0.99 * (len(ordered) - 1))] * 1000, 1)
            r.lateness_max_ms = round(ordered[-1] * 1000, 1)
        # Growth is judged after a warm-up (imports, pools, caches fill in the first minutes) and
        # only on runs long enough to have several samples after it.
        warm_up = max(RSS_WARM_UP_S, r.duration_s / 4)
        settled = [kb for at, kb in r.rss_kb if at >= warm_up]
        if len(settled) >= 6:
            r.rss_growth_kb = settled[-1] - settled[0]
            if r.rss_growth_kb > max(RSS_GROWTH_LIMIT_KB, settled[0] // 5):
                r.violations.append(f"the stable worker's RSS grew by {r.rss_growth_kb} kB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600)
    parser.add_argument("--policy", choices=["retry", "fail"], default="retry")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sq-soak-") as d:
        report = Soak(args.duration, args.policy, args.seed, Path(d)).run()
    data = report.__dict__
    if args.json:
        args.json.write_text(json.dumps(data, indent=2))
    print(
        f"soak {report.duration_s}s, policy {report.policy}, seed {args.seed}: "
        f"{report.campaigns} campaigns, {report.tasks} emails, {report.sent} sent, "
        f"{report.duplicates} duplicates, {report.failed} failed, {report.kills} worker kills; "
        f"{report.throughput_per_s}/s; lateness p50 {report.lateness_p50_ms} ms, "
        f"p99 {report.lateness_p99_ms} ms, max {report.lateness_max_ms} ms; stable worker RSS "
        f"{report.rss_kb[0][1] if report.rss_kb else '?'} -> "
        f"{report.rss_kb[-1][1] if report.rss_kb else '?'} kB "
        f"(growth after warm-up {report.rss_growth_kb} kB)"
    )
    for violation in report.violations:
        print(f"VIOLATION: {violation}")
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
