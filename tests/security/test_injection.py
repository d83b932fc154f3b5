"""Injection: mail headers and SQL.

- **Headers.** The corpus (tests/corpus) shows every CR/LF and line-separator trick in a
  From, Reply-To, subject, name or address refused before anything is stored. Here: the
  addresses that *are* accepted (quoted and internationalised names, Unicode addresses) come
  out of a real SMTP server as exactly the mailboxes written, with no header of the sender's
  making; and what ``normalize_sender`` accepts, the mailers accept.
- **SQL.** Metacharacters in the task search (``'``, ``%``, ``_``, ``--``, ``;``, ``/`` the
  LIKE escape character, ``\\``) are literal text, on SQLite and PostgreSQL, through the
  store, the API and the CLI; and the tables are still there afterwards.
"""

from __future__ import annotations

import email.utils
import json
import os
import sqlite3
import warnings
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sendqueue.adapters.mail.mime import build_message
from sendqueue.adapters.sql import SqlTaskStore
from sendqueue.bootstrap import bootstrap
from sendqueue.cli import app as cli_app
from sendqueue.domain.addresses import normalize_sender
from sendqueue.domain.errors import InvalidField
from sendqueue.domain.lifecycle import TaskState
from sendqueue.ports import OutgoingMessage
from sendqueue.services.importing.recipients import Templates
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from sendqueue.web.app import create_app
from tests.support.app import T0, open_policy
from tests.support.smtp import SmtpSink

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*install `httpx2`")
    from fastapi.testclient import TestClient

# -- headers ------------------------------------------------------------------------------------

ACCEPTED_SENDERS = [
    ("news@example.com", "news@example.com"),
    ("  News <news@example.com>  ", "News <news@example.com>"),
    ("Dr. Who <who@example.com>", '"Dr. Who" <who@example.com>'),
    ('"Doe, John" <john@example.com>', '"Doe, John" <john@example.com>'),
    ('"Ada \\"the countess\\"" <ada@example.com>', '"Ada \\"the countess\\"" <ada@example.com>'),
    ("Jörg Ünal <jorg@example.com>", "Jörg Ünal <jorg@example.com>"),
    ("Desk <news@münchen.de>", "Desk <news@münchen.de>"),
    ("Desk <news@xn--mnchen-3ya.de>", "Desk <news@münchen.de>"),
    ("Ünï <ünï@exämple.com>", "Ünï <ünï@exämple.com>"),
    ("Team <TEAM@Example.COM>", "Team <TEAM@example.com>"),
]

REFUSED_SENDERS = [
    "News <news@example.com>\r\nBcc: eve@example.net",
    "News\nBcc: eve@example.net <news@example.com>",
    "News\rBcc: eve@example.net <news@example.com>",
    "News\u2028Bcc: eve@example.net <news@example.com>",
    "News\u2029 <news@example.com>",
    "News\u0085 <news@example.com>",
    "News\x0b <news@example.com>",
    "News\x0c <news@example.com>",
    "News\x00 <news@example.com>",
    "News\x1b[31m <news@example.com>",
    "news@example.com, eve@example.net",
    "News <news@example.com>, Eve <eve@example.net>",
    "news@example.com; eve@example.net",
    "news@example.com\tBcc: eve@example.net",
    "=?utf-8?q?x=0D=0ABcc:_eve@example.net?= <news@example.com>",
    "news@exa mple.com",
    "News <>",
    "",
    "   ",
    "newsroom",
]


@pytest.mark.parametrize(("given", "stored"), ACCEPTED_SENDERS)
def test_accepted_senders_are_normalised_and_the_mailers_take_them(given: str, stored: str) -> None:
    value = normalize_sender(given, "from")
    assert value == stored
    # what was accepted at creation is accepted at send time (a refusal there would fail
    # every email of the campaign)
    message = build_message(
        OutgoingMessage(
            message_id="<t-1@example.com>", from_addr=value, reply_to=value,
            to_addr="ada@example.com", to_name="Ada", subject="s", text="t", html=None,
            date=datetime(2026, 12, 1, tzinfo=UTC), headers={},
        )
    )  # fmt: skip
    assert len(email.utils.getaddresses([str(message["From"])])) == 1


@pytest.mark.parametrize("given", REFUSED_SENDERS)
def test_injected_senders_are_refused_naming_the_field(given: str) -> None:
    with pytest.raises(InvalidField) as refused:
        normalize_sender(given, "reply_to")
    assert refused.value.field == "reply_to"


@pytest.fixture
def api_with_smtp(tmp_path: Path, smtp_sink: SmtpSink) -> Iterator[tuple[TestClient, Any]]:
    container = bootstrap(
        Settings(
            _env_file=None,
            database_url=f"sqlite:///{tmp_path / 'store.db'}",
            scheduler_url=f"sqlite:///{tmp_path / 'scheduler.db'}",
            mailer=smtp_sink.url(),
            default_timezone="UTC",
            space_late_sends=False,  # the fake clock fires every send at once, late
        ),
        clock=FakeClock(T0),
    )
    client = TestClient(create_app(container), base_url="http://testserver")
    with client:
        yield client, container
    container.close()


def test_tricky_but_valid_values_arrive_as_exactly_the_headers_written(
    api_with_smtp: tuple[TestClient, Any], smtp_sink: SmtpSink
) -> None:
    client, container = api_with_smtp
    body = {
        "name": "headers",
        "from": '"Jörg Q Ünal, Desk" <news@münchen.de>',
        "reply_to": '"Doe, John: Bcc" <john@example.com>',
        "recipients": [
            {"email": "ada@example.com", "name": 'Ada "the countess", Lovelace: Bcc'},
            {"email": "jörg@example.com", "name": "Jörg <not@an.address>"},
        ],
        "templates": {"subject": "Für {{ name }}: Bcc: eve@example.net", "body": "Hi"},
        "policy": {"timezone": "UTC", "weekdays": "mon-sun", "windows": ["00:00-24:00"],
                   "per_day": 10000, "start": T0.isoformat()},
    }  # fmt: skip
    created = client.post("/api/campaigns", json=body)
    assert created.status_code == 201, created.text
    cid = created.json()["id"]
    assert container.provisioner.provision(cid).status == "done"
    container.clock.advance(60)  # both due, neither SENDQUEUE_MAX_LATENESS late
    container.scheduler.fire_due(container.invoke)
    assert container.store.count_tasks(cid)[TaskState.FINISHED] == 2
    received = {m.rcpt_tos[0]: m for m in smtp_sink.wait_for(2)}
    assert set(received) == {"ada@example.com", "jörg@example.com"}
    for mail in received.values():
        # one mailbox per address header, exactly the one written, and no header of the
        # user's making (a Bcc: in a display name or a subject stays text)
        assert [name for name, _ in mail.message.items()].count("Bcc") == 0
        assert email.utils.getaddresses([mail["From"] or ""]) == [
            ("Jörg Q Ünal, Desk", "news@xn--mnchen-3ya.de")
        ]
        assert email.utils.getaddresses([mail["Reply-To"] or ""]) == [
            ("Doe, John: Bcc", "john@example.com")
        ]
        assert mail.mail_from == "news@xn--mnchen-3ya.de"
        assert len(mail.rcpt_tos) == 1
    ada = received["ada@example.com"]
    assert email.utils.getaddresses([ada["To"] or ""]) == [
        ('Ada "the countess", Lovelace: Bcc', "ada@example.com")
    ]
    assert ada["Subject"] == 'Für Ada "the countess", Lovelace: Bcc: Bcc: eve@example.net'
    jorg = received["jörg@example.com"]
    assert email.utils.getaddresses([jorg["To"] or ""]) == [
        ("Jörg <not@an.address>", "jörg@example.com")
    ]


# -- SQL ------------------------------------------------------------------------------------------

EMAILS = [
    "o'brien@example.com", "obrien@example.com", "a%b@example.com", "axb@example.com",
    "x_y@example.com", "xzy@example.com", "a--b@example.com", "a-b@example.com",
    "a/b@example.com", "ab@example.com", "plain@example.com",
]  # fmt: skip

SEARCHES: list[tuple[str, list[str]]] = [
    ("'", ["o'brien@example.com"]),
    ("O'Brien", ["o'brien@example.com"]),
    ("%", ["a%b@example.com"]),
    ("a%b", ["a%b@example.com"]),
    ("_", ["x_y@example.com"]),
    ("x_y", ["x_y@example.com"]),
    ("--", ["a--b@example.com"]),
    ("/", ["a/b@example.com"]),
    ("a/b", ["a/b@example.com"]),
    (";", []),
    ("\\", []),
    ("\\%", []),
    ("/%", []),
    ("' OR '1'='1", []),
    ("' OR 1=1 --", []),
    ("%' OR email LIKE '%", []),
    ("x'; DROP TABLE tasks; --", []),
    ("'); DELETE FROM tasks WHERE ('1'='1", []),
    ('" OR ""="', []),
    ("*", []),
    ("[a-z]", []),
    ("\x00", []),
    ("a\x00", []),
]


def _store_with(url: str, home: Path) -> tuple[SqlTaskStore, str]:
    app = bootstrap(
        Settings(
            _env_file=None,
            database_url=url,
            scheduler_url=f"sqlite:///{home / 'scheduler.db'}",
            default_timezone="UTC",
        ),
        clock=FakeClock(T0),
    )
    cid = app.campaign_import.create_from_rows(
        name="search",
        rows=[{"email": e} for e in EMAILS],
        policy=open_policy(),
        templates=Templates(subject="s", body="b"),
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    app.scheduler.close()
    store = app.store
    assert isinstance(store, SqlTaskStore)
    return store, cid


def _check_searches(search: Callable[[str], list[str]], total: Callable[[], int]) -> None:
    for text, expected in SEARCHES:
        assert sorted(search(text)) == sorted(expected), text
    assert total() == len(EMAILS)  # nothing deleted, no table dropped


def test_search_metacharacters_are_literal_on_sqlite(tmp_path: Path) -> None:
    store, cid = _store_with(f"sqlite:///{tmp_path / 'store.db'}", tmp_path)
    _check_searches(
        lambda text: [t.email for t in store.list_tasks(cid, search=text, limit=100)],
        lambda: sum(store.count_tasks(cid).values()),
    )
    conn = sqlite3.connect(tmp_path / "store.db")
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    conn.close()
    assert {"campaigns", "recipients", "tasks", "change_log"} <= tables
    store.close()


@pytest.mark.postgres
def test_search_metacharacters_are_literal_on_postgresql(postgres_url: str, tmp_path: Path) -> None:
    store, cid = _store_with(postgres_url, tmp_path)
    _check_searches(
        lambda text: [t.email for t in store.list_tasks(cid, search=text, limit=100)],
        lambda: sum(store.count_tasks(cid).values()),
    )
    store.close()


def test_search_metacharacters_are_literal_through_the_api_and_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store, cid = _store_with(url, tmp_path)
    store.close()
    container = bootstrap(
        Settings(
            _env_file=None,
            database_url=url,
            scheduler_url=f"sqlite:///{tmp_path / 'scheduler.db'}",
        ),
        clock=FakeClock(T0),
    )
    with TestClient(create_app(container)) as client:

        def api(text: str) -> list[str]:
            response = client.get(f"/api/campaigns/{cid}/tasks", params={"search": text})
            if "\x00" in text:  # refused before any route runs: no parameter holds one
                assert response.status_code == 422, response.text
                assert response.json()["error"]["field"] == "query"
                return []
            assert response.status_code == 200, response.text
            return [t["email"] for t in response.json()["tasks"]]

        _check_searches(api, lambda: sum(container.store.count_tasks(cid).values()))
    container.close()

    for key in [k for k in os.environ if k.startswith("SENDQUEUE_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    env = {"SENDQUEUE_DATABASE_URL": url, "SENDQUEUE_SCHEDULER_URL": f"sqlite:///{tmp_path}/s.db"}
    runner = CliRunner()

    def cli(text: str) -> list[str]:
        result = runner.invoke(
            cli_app, ["campaign", "tasks", cid, "--search", text, "--json"], env=env
        )
        assert result.exit_code == 0, result.stderr
        return [t["email"] for t in json.loads(result.stdout)]

    for text, expected in SEARCHES:
        if "\x00" not in text:  # not an argv value
            assert sorted(cli(text)) == sorted(expected), text
