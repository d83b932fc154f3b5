"""A command started with refused settings, as a real process: only the plain sentences on
stderr (``error: SENDQUEUE_...``, one per problem), nothing on stdout, exit status 2 (invalid
input, as the README documents), never pydantic's type tags, its link or a secret."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import sendqueue

PASSWORD = "hunter2-Zq8vX"
#: The source tree of the sendqueue under test, for the child process (whatever its cwd).
SRC = str(Path(sendqueue.__file__).resolve().parents[1])
FEEDBACK = (
    "error: SENDQUEUE_FEEDBACK_IMAP needs SENDQUEUE_SECRET_KEY, which signs the Message-ID of "
    "every email: a bounce or a reply counts only when it proves the email it is about"
)


def run_cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SENDQUEUE_")}
    clean["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))
    clean.update(
        SENDQUEUE_DATABASE_URL=f"sqlite:///{tmp_path / 'store.db'}",
        SENDQUEUE_SCHEDULER_URL=f"sqlite:///{tmp_path / 'scheduler.db'}",
        SENDQUEUE_MAILER=f"maildir:{tmp_path / 'outbox'}",
    )
    clean.update({f"SENDQUEUE_{name.upper()}": value for name, value in env.items()})
    return subprocess.run(
        [sys.executable, "-m", "sendqueue.cli", *args],
        cwd=tmp_path,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (
            ("campaign", "list"),
            {"feedback_interval": "0"},
            ["error: SENDQUEUE_FEEDBACK_INTERVAL: must be at least 1 and at most 86400"],
        ),
        (
            ("worker",),
            {"mailer": f"smtp://u:{PASSWORD}@smtp.example.com:99999", "execution": "cron"},
            [
                "error: SENDQUEUE_EXECUTION: must be 'embedded', 'procrastinate' or 'eventbridge'",
                "error: SENDQUEUE_MAILER: malformed URL: Port out of range 0-65535",
            ],
        ),
        (("serve",), {"feedback_imap": f"imaps://u:{PASSWORD}@imap.example.com/"}, [FEEDBACK]),
        # plan opens no store but reads the default timezone from the settings
        (
            ("plan", "--count", "1"),
            {"max_attempts": "many"},
            ["error: SENDQUEUE_MAX_ATTEMPTS: must be a whole number"],
        ),
        (
            ("db", "upgrade"),
            {"api_token": PASSWORD},
            ["error: SENDQUEUE_API_TOKEN: must be at least 16 characters long"],
        ),
    ],
)
def test_refused_settings_print_only_plain_sentences(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str], expected: list[str]
) -> None:
    done = run_cli(tmp_path, *args, **env)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == expected
    for word in ("errors.pydantic.dev", "type=", "Traceback", "validation error", PASSWORD):
        assert word not in done.stderr
    assert not (tmp_path / "store.db").exists()  # refused before anything was opened


def test_migrate_to_names_the_target_url(tmp_path: Path) -> None:
    done = run_cli(tmp_path, "db", "migrate-to", f"postgresql+psycopg://u:{PASSWORD}@h:99999/db")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: invalid target: SENDQUEUE_DATABASE_URL: not a valid PostgreSQL URL (Port out of "
        "range 0-65535); expected postgresql+psycopg://user:password@host:5432/db"
    ]
