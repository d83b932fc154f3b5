"""The bad-input corpus: every case a data file (or a line of one), one parametrized test per
family, each through the real entry point on a real SQLite deployment.

- ``csv.jsonl`` names a file in ``csv/`` and what ``sendqueue campaign create`` must say about
  it: an error naming the field (and the row, where one is at fault), or, for inputs that
  look odd but are valid (internationalised addresses, a BOM, duplicates), the recipients it
  must store.
- ``policy.jsonl``: sending policies, through ``campaign create``'s flags and through the
  API's JSON body (a policy with values the flags cannot spell goes through the API only).
- ``api.jsonl``: HTTP requests to the real app (TestClient): malformed and mistyped bodies,
  wrong media types, oversized uploads, unknown ids, illegal transitions, bad query
  parameters, header injection.

Every refused case must leave the store exactly as it was: the rows of campaigns, recipients,
tasks, the change log, schedules and dead letters are counted before and after. The API
cases run on SQLite and again on PostgreSQL (whose text columns refuse a NUL byte, for one).

Placeholders: ``@@REPEAT:x:N@@`` in a CSV file stands for ``x`` repeated N times (keeping
megabyte cells out of the repository), ``{templates}`` in CLI arguments for
``tests/corpus/templates``; in ``api.jsonl``, ``{draft}``, ``{active}``, ``{paused}``,
``{cancelled}``, ``{completed}`` are campaign ids in those states, ``{pending_task}`` a
Pending task of ``{active}`` and ``{finished_task}`` a Finished task of ``{completed}``, and
``{"repeat": [text, n]}`` anywhere in a body is ``text * n``; an API case's ``reason`` is text
the named row's problem must contain.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sqlite3
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner, Result

from sendqueue.adapters.sql import SqlTaskStore
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.cli import app as cli_app
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.web.app import create_app
from tests.support.app import T0

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*install `httpx2`")
    from fastapi.testclient import TestClient

CORPUS = Path(__file__).resolve().parent
TEMPLATES = CORPUS / "templates"
_REPEAT = re.compile(rb"@@REPEAT:(.):(\d+)@@")

STORE_TABLES = ("campaigns", "recipients", "tasks", "change_log")
SCHEDULER_TABLES = ("schedules", "dead_letters")

#: The recipients every policy case is created with.
GOOD_CSV = b"email,name,subject,body\nada@example.com,Ada,Hello,Body\n"
GOOD_ROWS = [{"email": "ada@example.com", "name": "Ada", "subject": "Hello", "body": "Body"}]

#: How each policy key is spelled as a ``campaign create`` flag; lists repeat the flag.
FLAGS = {
    "timezone": "--timezone",
    "per_day": "--per-day",
    "weekdays": "--weekdays",
    "windows": "--window",
    "start": "--start",
    "skip_dates": "--skip-date",
    "jitter_seconds": "--jitter",
    "seed": "--seed",
}


def load(name: str) -> list[dict[str, Any]]:
    # split on "\n" only: str.splitlines() would also split inside strings at U+2028 and kin
    lines = (CORPUS / name).read_text(encoding="utf-8").split("\n")
    return [json.loads(line) for line in lines if line.strip()]


def case_id(case: dict[str, Any]) -> str:
    return str(case.get("id") or case["file"])


CSV_CASES = load("csv.jsonl")
POLICY_CASES = load("policy.jsonl")
API_CASES = load("api.jsonl")


def sqlite_counts(path: Path, tables: tuple[str, ...]) -> dict[str, int]:
    conn = sqlite3.connect(path)
    try:
        return {t: int(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in tables}
    finally:
        conn.close()


def counts(home: Path) -> dict[str, int]:
    """Rows per table of the task store and the scheduler file (SQLite files in ``home``)."""
    return {
        **sqlite_counts(home / "store.db", STORE_TABLES),
        **sqlite_counts(home / "scheduler.db", SCHEDULER_TABLES),
    }


def stored_emails(home: Path, campaign_id: str) -> list[str]:
    conn = sqlite3.connect(home / "store.db")
    try:
        rows = conn.execute(
            "SELECT email FROM recipients WHERE campaign_id = ? ORDER BY position", (campaign_id,)
        ).fetchall()
    finally:
        conn.close()
    return [r[0] for r in rows]


# -- the command line ---------------------------------------------------------------------------


@dataclass
class CliDeployment:
    """A SQLite deployment driven through ``sendqueue`` (CliRunner), with a baseline campaign
    already provisioned, so that every table has rows and any change shows."""

    home: Path
    env: dict[str, str | None]
    runner: CliRunner = field(default_factory=CliRunner)

    def invoke(self, *args: str, env: dict[str, str] | None = None) -> Result:
        return self.runner.invoke(cli_app, list(args), env={**self.env, **(env or {})})

    def counts(self) -> dict[str, int]:
        return counts(self.home)


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliDeployment]:
    home = tmp_path_factory.mktemp("corpus-cli")
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("SENDQUEUE_")}
    env.update(
        SENDQUEUE_DATABASE_URL=f"sqlite:///{home / 'store.db'}",
        SENDQUEUE_SCHEDULER_URL=f"sqlite:///{home / 'scheduler.db'}",
        SENDQUEUE_MAILER=f"maildir:{home / 'outbox'}",
        SENDQUEUE_DEFAULT_TIMEZONE="UTC",
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(home)  # no stray .env file is read
        deployment = CliDeployment(home, env)
        good = home / "good.csv"
        good.write_bytes(GOOD_CSV)
        created = deployment.invoke(
            "campaign", "create", "--name", "baseline", "--recipients", str(good), "--json"
        )
        assert created.exit_code == 0, created.stderr
        cid = json.loads(created.stdout)["id"]
        provisioned = deployment.invoke("campaign", "provision", cid, "--json")
        assert provisioned.exit_code == 0, provisioned.stderr
        yield deployment


def _materialize(case: dict[str, Any], tmp_path: Path) -> Path:
    source: Path = CORPUS / "csv" / case["file"]
    data = source.read_bytes()
    if not _REPEAT.search(data):
        return source
    path: Path = tmp_path / case["file"]
    path.write_bytes(_REPEAT.sub(lambda m: m.group(1) * int(m.group(2)), data))
    return path


def _where(case: dict[str, Any]) -> str:
    """How the CLI names the place of a problem: ``row 3: email:`` or ``subject:``."""
    row = case.get("row")
    return f"row {row}: {case['field']}:" if row is not None else f"{case['field']}:"


def assert_refused(result: Result, case: dict[str, Any], where: str | list[str]) -> None:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    message = " ".join(result.stderr.split())  # Rich may wrap a long line
    places = [where] if isinstance(where, str) else where
    assert any(p in message for p in places), (places, result.stderr)
    if case.get("contains"):
        assert case["contains"] in message, (case["contains"], result.stderr)
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("case", CSV_CASES, ids=case_id)
def test_csv_case(cli: CliDeployment, case: dict[str, Any], tmp_path: Path) -> None:
    path = _materialize(case, tmp_path)
    args = [a.replace("{templates}", str(TEMPLATES)) for a in case.get("args", [])]
    before = cli.counts()
    result = cli.invoke(
        "campaign", "create", "--name", f"corpus {case['file']}", "--recipients", str(path),
        "--weekdays", "mon-sun", "--json", *args, env=case.get("env"),
    )  # fmt: skip
    after = cli.counts()
    expected = case.get("ok")
    if expected is None:
        assert_refused(result, case, _where(case))
        assert after == before
        return
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["import"]["duplicates"] == expected["duplicates"]
    assert stored_emails(cli.home, data["id"]) == expected["emails"]
    grown = {k: after[k] - before[k] for k in after}
    assert grown == {
        **dict.fromkeys(after, 0),
        "campaigns": 1,
        "recipients": len(expected["emails"]),
    }


def policy_flags(policy: dict[str, Any]) -> list[str] | None:
    """``campaign create`` flags for a policy, or None when a value has no flag spelling."""
    args: list[str] = []
    for key, value in policy.items():
        flag = FLAGS.get(key)
        if flag is None:
            return None
        values = value if isinstance(value, list) else [value]
        for item in values:
            if isinstance(item, bool) or not isinstance(item, str | int):
                return None
            args += [flag, str(item)]
    return args


def _policy_places(case: dict[str, Any]) -> list[str]:
    name = case["field"]
    places = [f"{name}:"]
    if name in FLAGS:  # a value Typer itself refuses is named by its flag
        places.append(f"'{FLAGS[name]}'")
    return places


def recipients_csv(count: int) -> bytes:
    rows = "".join(f"r{i}@example.com,R,Hello,Body\n" for i in range(count))
    return b"email,name,subject,body\n" + rows.encode()


@pytest.mark.parametrize(
    "case",
    [c for c in POLICY_CASES if c.get("cli", True) and policy_flags(c["policy"]) is not None],
    ids=case_id,
)
def test_policy_case_through_the_cli(
    cli: CliDeployment, case: dict[str, Any], tmp_path: Path
) -> None:
    flags = policy_flags(case["policy"])
    assert flags is not None
    recipients = tmp_path / "recipients.csv"
    recipients.write_bytes(recipients_csv(case.get("rows", 1)))
    before = cli.counts()
    result = cli.invoke(
        "campaign", "create", "--name", f"policy {case['id']}", "--recipients", str(recipients),
        "--json", "--weekdays", "mon-sun", *flags,
    )  # fmt: skip
    after = cli.counts()
    if case.get("ok"):
        assert result.exit_code == 0, result.stderr
        assert after["campaigns"] == before["campaigns"] + 1
        return
    assert_refused(result, case, _policy_places(case))
    assert after == before


# -- the HTTP API -------------------------------------------------------------------------------


@dataclass
class ApiDeployment:
    """The web app over a task store (SQLite, or PostgreSQL) and a scheduler file, with
    campaigns in every state to aim requests at."""

    home: Path
    container: Container
    client: TestClient
    ids: dict[str, str]

    def counts(self) -> dict[str, int]:
        store = self.container.store
        assert isinstance(store, SqlTaskStore)
        with store.engine.connect() as conn:
            out = {
                t: int(conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one())
                for t in STORE_TABLES
            }
        return {**out, **sqlite_counts(self.home / "scheduler.db", SCHEDULER_TABLES)}


@contextmanager
def _database(kind: str) -> Iterator[str | None]:
    """A fresh PostgreSQL database for the module (dropped afterwards), or None for SQLite."""
    if kind == "sqlite":
        yield None
        return
    from tests.conftest import POSTGRES_ADMIN_URL, _admin_connect

    name = f"sq_corpus_{secrets.token_hex(6)}"
    with _admin_connect() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    try:
        yield f"{base}/{name}"
    finally:
        with _admin_connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


#: The smallest upload limit the settings allow: oversized cases stay small.
API_MAX_UPLOAD = 4096


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def api(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ApiDeployment]:
    with _database(request.param) as url:
        yield from _api_deployment(tmp_path_factory.mktemp("corpus-api"), url)


def _api_deployment(home: Path, url: str | None) -> Iterator[ApiDeployment]:
    settings = Settings(
        _env_file=None,
        database_url=url or f"sqlite:///{home / 'store.db'}",
        scheduler_url=f"sqlite:///{home / 'scheduler.db'}",
        mailer=f"maildir:{home / 'outbox'}",
        default_timezone="UTC",
        max_upload_bytes=API_MAX_UPLOAD,
        auto_pause_after=0,
    )
    clock = FakeClock(T0)
    mailer = RecordingMailer()
    container = bootstrap(settings, clock=clock, mailer=mailer)
    client = TestClient(create_app(container), base_url="http://testserver")
    with client:
        ids = _campaigns_in_every_state(container, clock)
        yield ApiDeployment(home, container, client, ids)
    container.close()


def _campaigns_in_every_state(container: Container, clock: FakeClock) -> dict[str, str]:
    from datetime import timedelta

    from sendqueue.services.importing.recipients import Templates
    from tests.support.app import csv_bytes, open_policy

    def new(count: int, days_ahead: int = 30) -> str:
        return container.campaign_import.create(
            name="target",
            recipients=csv_bytes(count),
            policy=open_policy(start=T0 + timedelta(days=days_ahead)),
            templates=Templates(),
        ).campaign.id

    ids = {"draft": new(1), "completed": new(1, days_ahead=0)}
    for state in ("active", "paused", "cancelled"):
        ids[state] = new(2)
    for state in ("completed", "active", "paused", "cancelled"):
        assert container.provisioner.provision(ids[state]).status == "done"
    container.campaign_controls.pause(ids["paused"])
    container.campaign_controls.cancel(ids["cancelled"])
    clock.advance(60)  # the completed campaign's one email is due; the others' in 30 days
    container.scheduler.fire_due(container.invoke)  # type: ignore[attr-defined]
    assert container.store.get_campaign(ids["completed"]).state is CampaignState.COMPLETED
    (finished,) = container.store.list_tasks(ids["completed"])
    assert finished.state is TaskState.FINISHED
    ids["finished_task"] = finished.id
    ids["cancelled_task"] = container.campaign_controls.cancel_task(f"{ids['active']}-0").id
    ids["pending_task"] = f"{ids['active']}-1"
    return ids


_PLACEHOLDER = re.compile(r"\{(draft|active|paused|cancelled|completed|\w+_task)\}")


def fill(text: str, ids: dict[str, str]) -> str:
    """``text`` with the placeholders of the module docstring replaced (and nothing else:
    Jinja's ``{{ name }}`` stays as it is)."""
    return _PLACEHOLDER.sub(lambda m: ids[m.group(1)], text)


def _fill(value: Any, ids: dict[str, str]) -> Any:
    if isinstance(value, str):
        return fill(value, ids)
    if isinstance(value, list):
        return [_fill(v, ids) for v in value]
    if isinstance(value, dict):
        if set(value) == {"repeat"}:
            text, times = value["repeat"]
            return text * times
        return {k: _fill(v, ids) for k, v in value.items()}
    return value


def _request(api: ApiDeployment, case: dict[str, Any]) -> Any:
    ids = api.ids
    path = fill(case["path"], ids)
    kwargs: dict[str, Any] = {"params": _fill(case.get("params"), ids)}
    headers = dict(case.get("headers", {}))
    if "json" in case:
        kwargs["json"] = _fill(case["json"], ids)
    elif "content" in case:
        content = _fill(case["content"], ids)
        kwargs["content"] = content.encode("utf-8") if isinstance(content, str) else content
    elif "content_b64" in case:
        import base64

        kwargs["content"] = base64.b64decode(case["content_b64"])
    elif "form" in case:
        form = _fill(case["form"], ids)
        files = form.pop("files", {})
        kwargs["data"] = form
        kwargs["files"] = [
            (name, (spec.get("filename", "r.csv"), spec["content"].encode("utf-8"),
                    spec.get("type", "text/csv")))
            for name, specs in files.items()
            for spec in (specs if isinstance(specs, list) else [specs])
        ]  # fmt: skip
    if headers:
        kwargs["headers"] = headers
    return api.client.request(case["method"], path, **kwargs)


@pytest.mark.parametrize("case", API_CASES, ids=case_id)
def test_api_case(api: ApiDeployment, case: dict[str, Any]) -> None:
    before = api.counts()
    response = _request(api, case)
    after = api.counts()
    assert response.status_code == case["status"], response.text
    error = response.json()["error"]
    assert error["status"] == case["status"]
    if "field" in case:
        if "row" in case:
            problems = error.get("errors", [])
            assert any(
                p.get("row") == case["row"]
                and p.get("field") == case["field"]
                and case.get("reason", "") in p.get("reason", "")
                for p in problems
            ), problems
        else:
            assert error.get("field") == case["field"], error
    for text in case.get("contains", []):
        assert fill(text, api.ids) in error["message"], error
    assert after == before


def _api_policy_field(case: dict[str, Any]) -> str:
    return str(case.get("api_field", case["field"]))


@pytest.mark.parametrize("case", POLICY_CASES, ids=case_id)
def test_policy_case_through_the_api(api: ApiDeployment, case: dict[str, Any]) -> None:
    rows = case.get("rows", 1)
    body = {
        "name": f"policy {case['id']}",
        "recipients": [{**GOOD_ROWS[0], "email": f"r{i}@example.com"} for i in range(rows)],
        "policy": {"weekdays": "mon-sun", **case["policy"]},
    }
    before = api.counts()
    response = api.client.post("/api/campaigns", json=body)
    after = api.counts()
    if case.get("ok"):
        assert response.status_code == 201, response.text
        assert after["campaigns"] == before["campaigns"] + 1
        return
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == _api_policy_field(case), error
    if case.get("contains"):
        assert case["contains"] in error["message"], error
    assert after == before


def test_the_corpus_is_large_enough() -> None:
    # the issue asks for at least 150 bad inputs kept as data
    assert len(CSV_CASES) + len(POLICY_CASES) + len(API_CASES) >= 150
