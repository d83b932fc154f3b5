"""``sendqueue sender add|update|show`` with a sender's mailbox, signature and OAuth grant,
through the real command line (CliRunner, SQLite files): the fields round-trip, the secrets
never show, and the transport rules refuse an option naming its field with nothing changed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sendqueue.adapters.sql import open_store
from sendqueue.cli import app

SECRETS = ("hunter2/very?secret#", "1//refresh-Zq8", "client-secret-Wx4")
IMAP = "imaps://anna:hunter2%2Fvery%3Fsecret%23@imap.example.com/INBOX"
OAUTH = (
    "--oauth-token-url", "https://oauth2.example.com/token", "--oauth-client-id", "client-42",
    "--oauth-refresh-token", SECRETS[1], "--oauth-client-secret", SECRETS[2],
)  # fmt: skip


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


def run(cli: CliRunner, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = cli.invoke(app, list(args), env=env)
    for secret in SECRETS:
        assert secret not in result.stdout + result.stderr, (args, result.stdout, result.stderr)
    return result.exit_code, result.stdout, result.stderr


def run_json(cli: CliRunner, *args: str) -> Any:
    code, out, err = run(cli, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def _stored(tmp_path: Path) -> list[Any]:
    store: Any = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        return list(store.list_senders())
    finally:
        store.close()


def test_mailbox_signature_and_grant_round_trip(cli: CliRunner, tmp_path: Path) -> None:
    html = tmp_path / "sig.html"
    html.write_text("<p>Anna</p>", encoding="utf-8")
    added = run_json(
        cli, "sender", "add", "--email", "anna@example.com", "--imap", IMAP,
        "--signature", "Anna", "--signature-html-file", str(html), *OAUTH,
    )  # fmt: skip
    assert added["imap"] == "imaps://anna:***@imap.example.com/INBOX"
    assert (added["signature_text"], added["signature_html"]) == ("Anna", "<p>Anna</p>")
    assert added["oauth"] == {
        "token_url": "https://oauth2.example.com/token", "client_id": "client-42",
        "scope": None, "refresh_token": "***", "client_secret": "***",
    }  # fmt: skip
    [stored] = _stored(tmp_path)
    assert stored.imap == IMAP and stored.oauth.refresh_token == SECRETS[1]
    code, out, _ = run(cli, "sender", "show", "anna@example.com", "--days", "1")
    assert code == 0
    assert "imap: imaps://anna:***@imap.example.com/INBOX" in out
    assert "signature: text and HTML" in out and "refresh_token: ***" in out
    listed = run_json(cli, "sender", "list")
    assert listed[0]["oauth"]["client_secret"] == "***"

    # one grant field changes, the others stay; then everything is cleared
    text = tmp_path / "sig.txt"
    text.write_text("Anna from Sales\n", encoding="utf-8")
    run_json(
        cli, "sender", "update", "anna@example.com", "--oauth-refresh-token", "new-token-1",
        "--signature-file", str(text),
    )  # fmt: skip
    [stored] = _stored(tmp_path)
    assert (stored.oauth.refresh_token, stored.oauth.client_secret) == ("new-token-1", SECRETS[2])
    assert stored.signature_text == "Anna from Sales\n"
    cleared = run_json(
        cli, "sender", "update", "anna@example.com", "--imap", "", "--no-oauth", "--no-signature"
    )
    assert [cleared[k] for k in ("imap", "oauth", "signature_text", "signature_html")] == [
        None, None, "", None,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "env", "field", "words"),
    [
        (
            ["--mailer", "maildir:./outbox-of-anna"],
            {"SENDQUEUE_ENVIRONMENT": "production"},
            "transport",
            "delivers nothing",
        ),
        (
            ["--mailer", f"smtp://anna:{SECRETS[0]}@smtp.example.com:25?security=none"],
            {},
            "transport",
            "percent-encode",
        ),
        (
            ["--mailer", "smtp://anna:pw-9@smtp.example.com:25?security=none"],
            {},
            "transport",
            "unencrypted to smtp.example.com:25",
        ),
        (
            ["--imap", "imap://anna:pw-9@imap.example.com/INBOX?security=none"],
            {},
            "imap",
            "unencrypted to imap.example.com:143",
        ),
        (
            ["--mailer", "smtp://anna:pw-9@smtp.example.com:587"],
            {"SENDQUEUE_TRANSPORT_HOSTS": "*.mail.example.com"},
            "transport",
            "smtp.example.com is not in SENDQUEUE_TRANSPORT_HOSTS",
        ),
        (
            ["--imap", "imaps://anna:pw-9@imap.example.com/INBOX"],
            {"SENDQUEUE_TRANSPORT_HOSTS": "smtp.example.com"},
            "imap",
            "imap.example.com is not in SENDQUEUE_TRANSPORT_HOSTS",
        ),
        (["--oauth-client-id", "c"], {}, "oauth.token_url", "token endpoint"),
    ],
)
def test_a_refused_transport_names_its_field_and_changes_nothing(
    cli: CliRunner,
    tmp_path: Path,
    args: list[str],
    env: dict[str, str],
    field: str,
    words: str,
) -> None:
    if env.get("SENDQUEUE_ENVIRONMENT") == "production":
        env = {
            **env,
            "SENDQUEUE_MAILER": "smtp://127.0.0.1:2525",
            "SENDQUEUE_PUBLIC_URL": "https://mail.example.com",
            "SENDQUEUE_SECRET_KEY": "transport-rules-secret-0123456789abcdef",
            "SENDQUEUE_API_TOKEN": "transport-rules-7Qe2-Lm9x",
        }
    code, _, err = run(cli, "sender", "add", "--email", "bob@example.com", *args, env=env)
    assert code == 2 and err.startswith(f"error: {field}: ") and words in err, err
    assert _stored(tmp_path) == []
    run(cli, "sender", "add", "--email", "anna@example.com", "--signature", "Anna")
    [before] = _stored(tmp_path)
    code, _, err = run(cli, "sender", "update", "anna@example.com", *args, env=env)
    assert code == 2 and err.startswith(f"error: {field}: "), err
    assert _stored(tmp_path) == [before]
    assert not (tmp_path / "outbox-of-anna").exists()


def test_a_signature_file_that_cannot_be_read_names_its_field(
    cli: CliRunner,
    tmp_path: Path,
) -> None:
    binary = tmp_path / "sig.bin"
    binary.write_bytes(b"\xff\xfe\x00")
    for option, path, field in [
        ("--signature-file", tmp_path / "missing.txt", "signature_text"),
        ("--signature-html-file", binary, "signature_html"),
    ]:
        code, _, err = run(cli, "sender", "add", "--email", "a@example.com", option, str(path))
        assert code == 2 and err.startswith(f"error: {field}: cannot be read"), err
    assert _stored(tmp_path) == []


def test_check_fails_a_stored_transport_the_rules_refuse(cli: CliRunner, tmp_path: Path) -> None:
    """A sender stored before the allow-list was set: ``sendqueue check`` names why its
    transport is refused, as its sends would fail."""
    run(cli, "sender", "add", "--email", "anna@example.com", "--mailer", "smtp://anna:pw-9@x.org")
    env = {"SENDQUEUE_TRANSPORT_HOSTS": "*.example.com"}
    code, out, _ = run(cli, "check", "--json", "--timeout", "2", env=env)
    results = {r["part"]: r for r in json.loads(out)}
    refused = results["sender anna@example.com"]
    assert code != 0 and refused["status"] == "failed", results
    assert "x.org is not in SENDQUEUE_TRANSPORT_HOSTS" in refused["detail"], refused
    assert refused["target"] == "smtp://anna:***@x.org"
