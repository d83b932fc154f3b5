"""The command line, end to end on the embedded default (SQLite files in a temp dir)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

import sendqueue
from sendqueue.adapters.scheduler_rules import local_now
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.cli import app
from sendqueue.domain.models import DeadLetter
from sendqueue.services.campaigns.demo import demo_csv, demo_policy
from sendqueue.services.importing.recipients import Templates
from sendqueue.settings import Settings
from sendqueue.testing import FakeClock, FakeScheduler

ROOT = Path(__file__).resolve().parents[2]
DEMO = [sys.executable, "-m", "sendqueue.cli", "demo"]


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    for key in list(os.environ):
        if key.startswith("SENDQUEUE_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SENDQUEUE_DATABASE_URL", f"sqlite:///{tmp_path / 'store.db'}")
    monkeypatch.setenv("SENDQUEUE_SCHEDULER_URL", f"sqlite:///{tmp_path / 'scheduler.db'}")
    monkeypatch.setenv("SENDQUEUE_MAILER", f"maildir:{tmp_path / 'outbox'}")
    return CliRunner()


def run(cli: CliRunner, *args: str) -> tuple[int, str, str]:
    result = cli.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_plan_json_has_exactly_the_documented_shape(cli: CliRunner) -> None:
    code, out, _ = run(
        cli, "plan", "--count", "3", "--per-day", "2", "--timezone", "Europe/Berlin",
        "--window", "09:00-12:00", "--window", "13:00-17:00", "--start", "2026-12-01T08:00",
        "--json",
    )  # fmt: skip
    assert code == 0
    data = json.loads(out)
    assert data == {
        "timezone": "Europe/Berlin",
        "sends": [
            {"index": 0, "send_at": "2026-12-01T08:00:00Z", "local": "2026-12-01T09:00:00+01:00"},
            {"index": 1, "send_at": "2026-12-01T12:30:00Z", "local": "2026-12-01T13:30:00+01:00"},
            {"index": 2, "send_at": "2026-12-02T08:00:00Z", "local": "2026-12-02T09:00:00+01:00"},
        ],
    }


def test_plan_table_has_a_per_day_summary(cli: CliRunner) -> None:
    code, out, _ = run(cli, "plan", "--count", "5", "--per-day", "2", "--start", "2026-12-01T08:00")
    assert code == 0
    assert "per day: 3 sending days" in out and "Tue 2026-12-01" in out


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--per-day", "0"], "per_day"),
        (["--per-day", "10001"], "per_day"),
        (["--timezone", "Mars/Olympus"], "timezone"),
        (["--window", "22:00-02:00"], "windows"),
        (["--window", "9-17"], "windows"),
        (["--window", "09:00-12:00", "--window", "11:00-13:00"], "windows"),
        (["--weekdays", "funday"], "weekdays"),
        (["--start", "yesterday"], "start"),
        (["--skip-date", "2026-02-30"], "skip_dates"),
        (["--jitter", "-5"], "jitter_seconds"),
        (["--count", "-1"], "count"),
    ],
)
def test_invalid_plan_input_exits_2_with_one_line_naming_the_field(
    cli: CliRunner, args: list[str], field: str
) -> None:
    code, out, err = run(cli, "plan", *args)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), err


def test_no_sending_day_is_a_clear_error(cli: CliRunner) -> None:
    # every Saturday for more than two years is skipped, and only Saturdays are allowed
    first = date(2026, 12, 5)
    skips = [x for w in range(110) for x in ("--skip-date", str(first + timedelta(weeks=w)))]
    code, out, err = run(
        cli, "plan", "--weekdays", "sat", "--start", "2026-12-01T08:00", "--count", "1", *skips
    )
    assert code == 2 and out == ""
    assert err.startswith("error: policy:") and "sat" in err.lower()


def _csv(path: Path, rows: int, bad: set[int]) -> None:
    lines = ["email,name,subject,body,plan"]
    for i in range(rows):
        email = f"user{i}@example.com" if i not in bad else f"user{i}-at-example.com"
        lines.append(f"{email},User {i},Hello {i},Dear {{{{ name }}}},gold")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_ten_thousand_rows_with_bad_rows_report_and_create_nothing_then_fixed_creates(
    cli: CliRunner, tmp_path: Path
) -> None:
    bad = {17, 999, 5000, 9998}
    _csv(tmp_path / "big.csv", 10_000, bad)
    code, out, err = run(cli, "campaign", "create", "--name", "Big", "--recipients", "big.csv")
    assert code == 2
    assert "4 problems" in err
    for index in sorted(bad):
        assert f"row {index + 2}: email:" in err  # header is row 1
    code, out, _ = run(cli, "campaign", "list", "--json")
    assert code == 0 and json.loads(out) == []

    _csv(tmp_path / "big.csv", 10_000, set())
    started = time.monotonic()
    code, out, err = run(
        cli, "campaign", "create", "--name", "Big", "--recipients", "big.csv", "--json"
    )
    elapsed = time.monotonic() - started
    assert code == 0, err
    created = json.loads(out)
    assert created["recipients"] == 10_000 and created["state"] == "draft"
    print(f"created a 10,000-recipient campaign in {elapsed:.2f}s")


def test_campaign_lifecycle_through_the_cli(cli: CliRunner, tmp_path: Path) -> None:
    (tmp_path / "p.csv").write_text(
        "email,name,company\nada@example.com,Ada,AE\ngrace@example.com,Grace,Navy\n"
        "ADA@example.com,Ada again,AE\n",
        encoding="utf-8",
    )
    (tmp_path / "body.txt").write_text("Hello {{ name }} of {{ company }}\n", encoding="utf-8")
    code, out, err = run(
        cli, "campaign", "create", "--name", "Launch", "--recipients", "p.csv",
        "--subject", "News for {{ company }}", "--body-file", "body.txt",
        "--from", "News <news@example.com>", "--start", "2030-01-07T09:00", "--json",
    )  # fmt: skip
    assert code == 0, err
    created = json.loads(out)
    cid = created["id"]
    assert created["import"] == {"rows": 3, "duplicates": 1}

    code, out, _ = run(cli, "campaign", "preview", cid, "--json")
    assert [s["email"] for s in json.loads(out)["sends"]] == [
        "ada@example.com",
        "grace@example.com",
    ]

    code, out, _ = run(cli, "campaign", "provision", cid, "--json")
    assert code == 0 and json.loads(out)["status"] == "done"

    code, out, _ = run(cli, "campaign", "show", cid, "--json")
    shown = json.loads(out)
    assert {"id", "name", "state", "counts"} <= set(shown)
    assert shown["state"] == "active"
    assert shown["counts"] == {
        "Pending": 2,
        "Running": 0,
        "Finished": 0,
        "Failed": 0,
        "Cancelled": 0,
    }

    code, out, _ = run(cli, "campaign", "tasks", cid, "--json")
    tasks = json.loads(out)
    assert [set(t) for t in tasks] == [
        {
            "id", "email", "sender", "step", "timezone", "state", "send_at", "sent_at",
            "attempts", "message_id", "error", "planned_at", "moves", "moved_reason", "reason",
            "outcome", "outcome_detail", "outcome_at", "paused", "late",
        }
    ] * 2  # fmt: skip
    assert tasks[0]["send_at"] == tasks[0]["planned_at"] == "2030-01-07T08:00:00Z"
    assert tasks[0]["sender"] == "News <news@example.com>"  # no senders: the campaign's From
    assert (tasks[0]["moves"], tasks[0]["moved_reason"], tasks[0]["paused"]) == (0, None, False)

    assert run(cli, "campaign", "pause", cid)[0] == 0
    # paused: no send time, in the JSON and in the table
    code, out, _ = run(cli, "campaign", "tasks", cid, "--json")
    paused = json.loads(out)
    assert [(t["send_at"], t["paused"]) for t in paused] == [(None, True)] * 2
    code, out, _ = run(cli, "campaign", "tasks", cid)
    assert code == 0 and out.count("paused") == 2 and "2030-01-07" not in out
    code, out, _ = run(cli, "campaign", "resume", cid, "--json")
    assert code == 0 and json.loads(out)["state"] == "active"
    code, out, _ = run(cli, "task", "cancel", tasks[0]["id"], "--json")
    assert code == 0 and json.loads(out)["state"] == "Cancelled"
    code, _, err = run(cli, "task", "cancel", tasks[0]["id"])
    assert code == 1 and "Cancelled" in err
    assert run(cli, "campaign", "cancel", cid)[0] == 0
    code, _, err = run(cli, "campaign", "resume", cid)
    assert code == 1 and "cancelled" in err
    code, _, err = run(cli, "campaign", "show", "cnope")
    assert code == 1 and "not found" in err
    code, out, _ = run(cli, "campaign", "tasks", cid, "--state", "cancelled", "--json")
    assert len(json.loads(out)) == 2
    code, _, err = run(cli, "campaign", "tasks", cid, "--state", "Lost")
    assert code == 2 and err.startswith("error: state:")

    code, out, _ = run(cli, "reconcile", "--json")
    assert code == 0 and json.loads(out)["ran"] is True
    code, out, _ = run(cli, "dlq", "list", "--json")
    assert code == 0 and json.loads(out) == []
    code, _, err = run(cli, "dlq", "redrive", "nope")
    assert code == 1 and "not found" in err


def test_campaign_tasks_after_beyond_the_cursor_range_is_refused_naming_after(
    cli: CliRunner, tmp_path: Path
) -> None:
    # Before the shared cursor check this reached SQLite, which raised an OverflowError.
    (tmp_path / "p.csv").write_text("email,name\nada@example.com,Ada\n", encoding="utf-8")
    code, out, err = run(
        cli, "campaign", "create", "--name", "Big cursor", "--recipients", "p.csv",
        "--subject", "Hi", "--body-file", "p.csv", "--json",
    )  # fmt: skip
    assert code == 0, err
    cid = json.loads(out)["id"]
    assert run(cli, "campaign", "provision", cid, "--json")[0] == 0

    code, out, err = run(cli, "campaign", "tasks", cid, "--after", "100000000000000000000")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: after:"), err

    largest = str(2**63 - 1)  # the largest cursor every store takes
    code, out, err = run(cli, "campaign", "tasks", cid, "--after", largest, "--json")
    assert code == 0 and json.loads(out) == [], err
    code, out, _ = run(cli, "campaign", "tasks", cid, "--after", "-1", "--json")
    assert code == 0 and [t["email"] for t in json.loads(out)] == ["ada@example.com"]


class _RedrivenMeanwhile:
    """A scheduler where another operator redrives ``stolen`` right after the first listing."""

    def __init__(self, inner: FakeScheduler, stolen: str) -> None:
        self.inner = inner
        self.stolen: str | None = stolen

    def dead_letters(self, *, limit: int = 1000) -> list[DeadLetter]:
        letters = self.inner.dead_letters(limit=limit)
        if self.stolen is not None:
            self.inner.redrive(self.stolen)
            self.stolen = None
        return letters

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_dlq_redrive_all_takes_every_page_and_skips_a_letter_redriven_meanwhile(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before the shared redrive_all service the CLI redrove only the first 1,000 letters and
    # aborted (exit 1) at one that someone else had redriven in the meantime.
    clock = FakeClock(datetime(2030, 1, 7, 10, 0, tzinfo=UTC))
    fake = FakeScheduler(clock)
    total = 1500
    for i in range(total):
        fake.create(
            f"t-{i:04d}", "g", datetime(2030, 1, 7, 9, 0), "UTC", {"task_id": f"t{i}"},
            f"token-{i}", max_retries=0,
        )  # fmt: skip

    def broken(payload: Any) -> None:
        raise RuntimeError("mailer down")

    assert fake.fire_due(broken) == total
    letters = [d.id for d in fake.dead_letters(limit=2 * total)]
    assert len(letters) == total
    stolen = letters[10]
    scheduler = _RedrivenMeanwhile(fake, stolen)
    monkeypatch.setattr(Container, "scheduler", property(lambda _self: scheduler))

    code, out, err = run(cli, "dlq", "redrive", "--all")
    assert code == 0, err
    lines = out.splitlines()
    assert f"skipped {stolen}: redriven by someone else meanwhile" in lines
    redriven = [line.split()[1] for line in lines if line.startswith("redriven ")]
    assert sorted(redriven) == sorted(set(letters) - {stolen})
    assert len(lines) == total
    assert fake.dead_letters(limit=2 * total) == []
    assert len(fake.list("g", limit=2 * total)) == total


def test_invalid_settings_are_refused_naming_the_variable(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SENDQUEUE_MAILER", "smtp://u:p@mail.example.com:25?security=none")
    code, _, err = run(cli, "campaign", "list")
    assert code == 2 and "SENDQUEUE_MAILER" in err and "unencrypted" in err


def test_db_upgrade(cli: CliRunner) -> None:
    code, out, _ = run(cli, "db", "upgrade")
    assert code == 0 and "revision" in out


def test_demo_delivers_into_the_maildir_outbox(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDQUEUE_")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sendqueue.cli",
            "demo",
            "--count",
            "3",
            "--interval",
            "0.5",
            "--no-ui",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert "done: 3 sent, 0 failed" in proc.stdout
    assert len(list((tmp_path / "outbox" / "new").iterdir())) == 3


def test_demo_serves_the_ui_and_delivers_until_stopped(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDQUEUE_")}
    proc = subprocess.Popen(
        [*DEMO, "--count", "2", "--interval", "0.5", "--port", "0"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = ""
        for line in proc.stdout:
            if "watch the demo live:" in line:
                url = line.split("live:", 1)[1].strip()
                break
        assert url.startswith("http://127.0.0.1:"), url
        page = httpx.get(url, timeout=10)
        assert page.status_code == 200 and "Demo" in page.text
        campaign_id = url.rstrip("/").rsplit("/", 1)[1]
        api = url.split("/campaigns/")[0] + f"/api/campaigns/{campaign_id}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if httpx.get(api, timeout=10).json()["counts"]["Finished"] == 2:
                break
            time.sleep(0.3)
        assert httpx.get(api, timeout=10).json()["counts"]["Finished"] == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        if proc.stdout:
            proc.stdout.close()
    assert proc.returncode == 0
    assert len(list((tmp_path / "outbox" / "new").iterdir())) == 2


def _worker_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDQUEUE_")}
    env["SENDQUEUE_DATABASE_URL"] = f"sqlite:///{tmp_path / 'store.db'}"
    env["SENDQUEUE_SCHEDULER_URL"] = f"sqlite:///{tmp_path / 'scheduler.db'}"
    env["SENDQUEUE_MAILER"] = f"maildir:{tmp_path / 'outbox'}"
    return env


def test_version_prints_without_a_command(cli: CliRunner) -> None:
    code, out, _ = run(cli, "--version")
    assert code == 0 and out.strip() == sendqueue.__version__


def test_worker_serves_its_metrics_on_the_metrics_port(tmp_path: Path) -> None:
    """In a split deployment (web and worker in two processes) the sends, alarms and repairs
    happen in the worker: its own /metrics counts them."""
    env = _worker_env(tmp_path)
    values: dict[str, Any] = {
        k.removeprefix("SENDQUEUE_").lower(): v
        for k, v in env.items()
        if k.startswith("SENDQUEUE_")
    }
    settings = Settings(_env_file=None, **values)
    setup = bootstrap(settings)
    cid = setup.campaign_import.create(
        name="metrics",
        recipients=demo_csv(2),
        policy=demo_policy(setup.clock.now(), "UTC", 2, 1),
        templates=Templates(subject="s", body="b"),
    ).campaign.id
    setup.provisioner.provision(cid)
    # A schedule whose invocation fails every time: a dead letter, so an alarm, in the worker.
    setup.scheduler.create(
        "bad-1",
        "metricstest",
        local_now(setup.clock.now(), "UTC"),
        "UTC",
        {"kind": "provision", "campaign_id": "missing"},
        "tok-bad-1",
        0,
    )
    setup.close()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sendqueue.cli", "worker", "--metrics-port", str(port)],
        cwd=tmp_path,
        env=_worker_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        body = ""
        wanted = (
            'sendqueue_sends_total{outcome="sent"} 2.0',
            "sendqueue_dead_letters_total 1.0",
            "sendqueue_alarms_total 1.0",
            "sendqueue_dead_letter_depth 1.0",
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
            except httpx.TransportError:
                time.sleep(0.2)
                continue
            assert response.status_code == 200
            body = response.text
            if all(line in body for line in wanted):
                break
            time.sleep(0.2)
        assert "# TYPE sendqueue_sends_total counter" in body, proc.poll()
        assert "# TYPE sendqueue_reconciler_repairs_total counter" in body
        for line in wanted:
            assert line in body.splitlines(), (line, body)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr


def test_worker_refuses_a_metrics_port_in_use_naming_the_option(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "sendqueue.cli", "worker", "--metrics-port", str(port)],
            cwd=tmp_path,
            env=_worker_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    assert proc.returncode == 2, proc.stderr
    assert "--metrics-port" in proc.stderr and "cannot listen" in proc.stderr
