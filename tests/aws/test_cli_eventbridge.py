"""`sendqueue serve` and `sendqueue worker` under SENDQUEUE_EXECUTION=eventbridge, as
processes on the moto server: there is no in-process worker on AWS (the send Lambda function is
it), so serve starts none and says so, worker refuses, and neither logs the irrelevant
SENDQUEUE_SCHEDULER_URL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from sendqueue.adapters.dynamodb.store import DynamoDbTaskStore
from tests.support.aws import REGION, SCHEDULE_GROUP, client, moto_url, world

CLI = [sys.executable, "-m", "sendqueue.cli"]
TABLE = "sendqueue"
#: A scheduler URL that must never show up in the logs of the AWS layer.
STRAY_SCHEDULER_URL = "sqlite:///stray-scheduler-file.db"


def _env(tmp_path: Path) -> dict[str, str]:
    made = world()
    DynamoDbTaskStore(client("dynamodb"), TABLE, create_table=True).close()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SENDQUEUE_", "AWS_"))}
    env.update(
        {
            "SENDQUEUE_EXECUTION": "eventbridge",
            "SENDQUEUE_DATABASE_URL": f"dynamodb://{TABLE}?region={REGION}",
            "SENDQUEUE_SCHEDULER_URL": STRAY_SCHEDULER_URL,
            "SENDQUEUE_SCHEDULE_GROUP": SCHEDULE_GROUP,
            "SENDQUEUE_SEND_FUNCTION_ARN": made.send_arn,
            "SENDQUEUE_SCHEDULER_ROLE_ARN": made.role_arn,
            "SENDQUEUE_DEAD_LETTER_QUEUE_URL": made.dlq_url,
            "SENDQUEUE_DEAD_LETTER_QUEUE_ARN": made.dlq_arn,
            "SENDQUEUE_MAILER": f"ses:{REGION}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_ENDPOINT_URL": moto_url(),
            "COLUMNS": "250",  # the log lines unwrapped
        }
    )
    return env


def test_serve_starts_no_worker_and_logs_the_schedule_group(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*CLI, "serve", "--port", "0"],
        cwd=tmp_path,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        banner = ""
        for line in proc.stdout:
            if "sendqueue is serving" in line:
                banner = line
                break
        assert "(worker: the send Lambda function)" in banner, banner
        url = banner.split("serving ", 1)[1].split()[0]
        # The API answers from DynamoDB on moto: the store is the AWS one.
        answer = httpx.get(f"{url.rstrip('/')}/api/campaigns", timeout=10)
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"campaigns": []}
    finally:
        proc.send_signal(signal.SIGTERM)
        _, logs = proc.communicate(timeout=30)
    assert proc.returncode == 0, logs
    assert "no worker in this process (as with --no-worker)" in logs, logs
    assert f"scheduler EventBridge Scheduler group {SCHEDULE_GROUP}," in logs, logs
    assert "stray-scheduler-file" not in logs, logs
    assert "stopped with an error" not in logs and "Traceback" not in logs, logs


def test_serve_with_no_worker_says_the_same(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*CLI, "serve", "--port", "0", "--no-worker"],
        cwd=tmp_path,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        banner = next((line for line in proc.stdout if "sendqueue is serving" in line), "")
        assert "(worker: the send Lambda function)" in banner, banner
    finally:
        proc.send_signal(signal.SIGTERM)
        _, logs = proc.communicate(timeout=30)
    assert proc.returncode == 0, logs
    assert "no worker in this process" not in logs, logs  # asked for: nothing to explain
    assert "stray-scheduler-file" not in logs, logs


def test_worker_refuses_at_start_and_points_to_serve(tmp_path: Path) -> None:
    done = subprocess.run(
        [*CLI, "worker"],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr
    assert "SENDQUEUE_EXECUTION" in done.stderr
    assert "send Lambda function" in done.stderr and "sendqueue serve" in done.stderr
    assert "worker started" not in done.stderr
    assert "stray-scheduler-file" not in done.stderr
