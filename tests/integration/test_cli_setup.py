"""``sendqueue init``, ``--config`` and ``sendqueue check`` end to end, against real parts:
Postfix and aiosmtpd (SMTP sign-in), Dovecot (IMAP sign-in), PostgreSQL (the task store), a
local HTTP server (the public URL), and closed ports for each failure."""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sendqueue.cli import app
from tests.support.mailservers import Dovecot, Postfix, free_port
from tests.support.smtp import SmtpSink

CONFIG = "outreach.env"


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    """A runner in an empty directory, with no SENDQUEUE_ variable set."""
    for key in list(os.environ):
        if key.startswith("SENDQUEUE_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    return CliRunner()


def run(cli: CliRunner, *args: str, input: str | None = None) -> tuple[int, str, str]:
    result = cli.invoke(app, list(args), input=input)
    return result.exit_code, result.stdout, result.stderr


def checked(cli: CliRunner, *args: str) -> tuple[int, dict[str, dict[str, str]], str]:
    """``check --json``: the exit status, the results by part, and everything printed."""
    code, out, err = run(cli, "--config", CONFIG, "check", "--json", "--timeout", "5", *args)
    return code, {r["part"]: r for r in json.loads(out)}, out + err


class _HealthServer(ThreadingHTTPServer):
    answer: tuple[int, bytes, dict[str, str]] = (200, b'{"status":"ok"}', {})


class _Health(BaseHTTPRequestHandler):
    server: _HealthServer

    def do_GET(self) -> None:
        status, body, headers = self.server.answer
        if self.path != "/healthz":
            status, body, headers = 404, b'{"detail":"Not Found"}', {}
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **headers}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def public_server() -> Iterator[_HealthServer]:
    """An HTTP server on 127.0.0.1 answering GET /healthz as sendqueue does."""
    server = _HealthServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def base_url(server: _HealthServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def init(cli: CliRunner, *flags: str, **values: str) -> tuple[int, str, str]:
    """``--config CONFIG init --no-input`` for development, with a sender unless given."""
    args = ["--config", CONFIG, "init", "--no-input", "--environment", "development", *flags]
    if "--sender-email" not in flags:
        values.setdefault("sender_email", "news@example.com")
    for name, value in values.items():
        args += [f"--{name.replace('_', '-')}", value]
    return run(cli, *args)


# -- init ------------------------------------------------------------------------------------


def test_init_writes_a_private_commented_file_that_every_command_reads(
    cli: CliRunner, smtp_sink: SmtpSink
) -> None:
    password = "Pw-Secret-9"
    code, out, err = run(
        cli, "--config", CONFIG, "init", "--no-input",
        "--public-url", "https://mail.example.com",
        "--mailer", f"smtp://news:{password}@127.0.0.1:{smtp_sink.port}?security=none",
        "--bounce-address", "bounces@example.com",
        "--sender-email", "news@example.com", "--sender-name", "Example News",
        "--sender-daily-cap", "20",
    )  # fmt: skip
    assert (code, err) == (0, "")
    path = Path(CONFIG)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = path.read_text().splitlines()
    values = dict(line.split("=", 1) for line in lines if line.startswith("SENDQUEUE_"))
    key = values["SENDQUEUE_SECRET_KEY"].strip("'")
    token = values["SENDQUEUE_API_TOKEN"].strip("'")
    assert len(key) == 64 and len(token) >= 40
    assert values["SENDQUEUE_ENVIRONMENT"] == "'production'"
    assert values["SENDQUEUE_DEFAULT_FROM"] == "'news@example.com'"
    for variable in values:  # each with its one-line comment above it
        above = lines[next(i for i, line in enumerate(lines) if line.startswith(variable)) - 1]
        assert above.startswith("# ") and len(above) > 10
    assert "# SENDQUEUE_FEEDBACK_IMAP=" in lines  # not given: offered, commented out
    # what it wrote, masked, and the next step
    assert password not in out and key not in out and token not in out
    assert f"SENDQUEUE_MAILER=smtp://news:***@127.0.0.1:{smtp_sink.port}?security=none" in out
    assert "SENDQUEUE_SECRET_KEY=*** (new)" in out and "SENDQUEUE_API_TOKEN=*** (new)" in out
    assert "added sender" in out and "(news@example.com): 20 a day" in out
    assert out.splitlines()[-1] == f"  sendqueue --config {CONFIG} check"
    # another command reads it: the sender is in the store it names
    code, out, _ = run(cli, "--config", CONFIG, "sender", "list", "--json")
    assert code == 0
    [sender] = json.loads(out)
    assert (sender["email"], sender["name"], sender["daily_cap"]) == (
        "news@example.com",
        "Example News",
        20,
    )
    assert smtp_sink.messages == []


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--public-url", "ftp://mail.example.com"], "--public-url (SENDQUEUE_PUBLIC_URL)"),
        (["--mailer", "maildir:./outbox", "--environment", "production"],
         "--mailer (SENDQUEUE_MAILER): the Maildir outbox delivers nothing"),
        (["--mailer", "smtp://u:Pw-Secret-9@mx.example.com?security=none"],
         "--mailer (SENDQUEUE_MAILER): refusing to send a password unencrypted"),
        (["--bounce-address", "two@example.com, three@example.com"],
         "--bounce-address (SENDQUEUE_BOUNCE_ADDRESS)"),
        (["--feedback-imap", "imap://bounces@127.0.0.1/INBOX"],
         "--feedback-imap (SENDQUEUE_FEEDBACK_IMAP): the mailbox's user and password"),
        (["--trusted-authserv", "mx google com"],
         "--trusted-authserv (SENDQUEUE_TRUSTED_AUTHSERV)"),
        (["--database-url", "mysql://db"], "--database-url (SENDQUEUE_DATABASE_URL)"),
        (["--environment", "staging"], "--environment (SENDQUEUE_ENVIRONMENT)"),
        (["--sender-email", "not an address"], "--sender-email: "),
        (["--sender-daily-cap", "0"], "--sender-daily-cap: must be from 1 to 10000"),
        (["--sender-name", "Bad\nName"], "--sender-name: "),
    ],
)  # fmt: skip
def test_a_bad_value_is_refused_naming_its_flag_and_nothing_is_written(
    cli: CliRunner, flags: list[str], named: str
) -> None:
    defaults = {"--public-url": "https://mail.example.com", "--mailer": "smtp://mx.example.com"}
    for flag, value in defaults.items():
        if flag not in flags:
            flags = [*flags, flag, value]
    code, out, err = init(cli, *flags)
    assert code == 2, out + err
    assert err.startswith(f"error: {named}"), err
    assert err.rstrip().endswith("nothing written")
    assert "Pw-Secret-9" not in out + err
    assert sorted(os.listdir()) == []  # no file, no store


def test_a_store_that_does_not_answer_exits_3_and_nothing_is_written(cli: CliRunner) -> None:
    store = f"postgresql+psycopg://postgres:Db-Pass-5@127.0.0.1:{free_port()}/sq"
    code, out, err = init(
        cli, public_url="https://mail.example.com", mailer="smtp://mx.example.com",
        database_url=store,
    )  # fmt: skip
    assert code == 3
    assert err.startswith("error: the task store: StoreUnavailable: ")
    assert "Connection refused" in err and err.rstrip().endswith("nothing written")
    assert "Db-Pass-5" not in out + err
    assert os.listdir() == []


def test_an_existing_file_is_kept_unless_forced_and_force_keeps_its_secrets(
    cli: CliRunner,
) -> None:
    flags = {"public_url": "https://mail.example.com", "mailer": "smtp://mx.example.com"}
    assert init(cli, **flags)[0] == 0
    before = Path(CONFIG).read_text()
    code, _, err = init(cli, **flags)
    assert code == 1
    assert f"{CONFIG} exists: not overwritten (--force replaces it" in err
    assert Path(CONFIG).read_text() == before

    code, out, _ = init(cli, "--force", **{**flags, "public_url": "https://news.example.com"})
    assert code == 0
    after = Path(CONFIG).read_text()
    assert "SENDQUEUE_PUBLIC_URL='https://news.example.com'" in after
    for variable in ("SENDQUEUE_SECRET_KEY", "SENDQUEUE_API_TOKEN"):
        [old] = [line for line in before.splitlines() if line.startswith(variable)]
        assert old in after.splitlines()  # the links already sent stay valid
        assert f"{variable}=*** (kept)" in out
    assert "was there already: kept as it is" in out  # the same sender, not added twice
    code, out, _ = run(cli, "--config", CONFIG, "sender", "list", "--json")
    assert len(json.loads(out)) == 1


def test_it_asks_for_what_no_flag_gives_and_again_after_a_refused_answer(
    cli: CliRunner,
) -> None:
    answers = [
        "http://mail.example.com",  # production: refused, asked again
        "https://mail.example.com",
        "maildir:./outbox",  # production: refused, asked again
        "smtp://news:pw@smtp.example.com:587",
        "bounces",  # not an address: asked again
        "bounces@example.com",
        "",  # no feedback mailbox
        "news@example.com",
        "",  # no name
        "",  # the default cap
    ]
    code, out, err = run(cli, "init", input="\n".join(answers) + "\n")
    assert code == 0, out + err
    assert err.count("Error: ") == 3
    assert "must be an https:// URL when SENDQUEUE_ENVIRONMENT=production" in err
    assert "the Maildir outbox delivers nothing" in err
    path = Path("sendqueue.env")  # the default file, which commands read without --config
    text = path.read_text()
    assert "SENDQUEUE_PUBLIC_URL='https://mail.example.com'" in text
    assert "SENDQUEUE_BOUNCE_ADDRESS='bounces@example.com'" in text
    assert "\nSENDQUEUE_FEEDBACK_IMAP" not in text
    assert "(news@example.com): 50 a day" in out
    assert out.splitlines()[-1] == "  sendqueue check"
    code, out, _ = run(cli, "sender", "list", "--json")
    assert [s["email"] for s in json.loads(out)] == ["news@example.com"]


def test_with_stdin_closed_a_missing_answer_names_its_flag(cli: CliRunner) -> None:
    code, _, err = run(cli, "init", "--public-url", "https://mail.example.com", input="")
    assert code == 2
    assert "error: --mailer: no answer (stdin is closed): give --mailer VALUE" in err
    assert os.listdir() == []
    code, _, err = init(cli, sender_email="")
    assert code == 2
    assert "--public-url: required (with --no-input nothing is asked)" in err


# -- --config ---------------------------------------------------------------------------------


def test_a_missing_config_file_is_an_error_from_the_option_or_the_variable(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run(cli, "--config", "nope.env", "sender", "list")
    assert code == 2
    assert "error: --config: no such file; write one with `sendqueue init`" in err
    monkeypatch.setenv("SENDQUEUE_CONFIG", "also-nope.env")
    code, _, err = run(cli, "check")
    assert code == 2
    assert "'also-nope.env'" in err


def test_the_variable_names_the_file_and_a_dot_env_is_still_read(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    Path(".env").write_text("SENDQUEUE_DEFAULT_TIMEZONE=Asia/Tokyo\n")
    code, out, _ = run(cli, "plan", "--count", "1", "--json")
    assert json.loads(out)["timezone"] == "Asia/Tokyo"
    Path("mine.env").write_text("SENDQUEUE_DEFAULT_TIMEZONE=America/Lima\n")
    monkeypatch.setenv("SENDQUEUE_CONFIG", "mine.env")
    code, out, _ = run(cli, "plan", "--count", "1", "--json")
    assert code == 0
    assert json.loads(out)["timezone"] == "America/Lima"


# -- check ------------------------------------------------------------------------------------


@pytest.mark.postgres
def test_check_passes_when_every_part_answers(
    cli: CliRunner,
    postfix: Postfix,
    dovecot: Dovecot,
    postgres_url: str,
    public_server: _HealthServer,
) -> None:
    code, _, err = init(
        cli,
        public_url=base_url(public_server),
        mailer=f"smtp://127.0.0.1:{postfix.port}?security=none",
        feedback_imap=dovecot.url,
        bounce_address=f"bounces@{'bounce.example'}",
        database_url=postgres_url,
    )
    assert code == 0, err
    code, results, printed = checked(cli)
    assert code == 0, printed
    assert {part: r["status"] for part, r in results.items()} == {
        "task store": "ok",
        "scheduler": "ok",
        "mailer": "ok",
        "feedback mailbox": "ok",
        "public URL": "ok",
    }
    assert results["mailer"]["detail"].startswith(f"SMTP 127.0.0.1:{postfix.port}: EHLO mta.")
    assert results["feedback mailbox"]["detail"].endswith("signed in, 0 messages in INBOX")
    assert results["task store"]["detail"] == "answered: 1 sender, last change #0"
    assert results["task store"]["target"].startswith("postgresql+psycopg://")
    assert dovecot.password not in printed
    # the text form: one line per part, and the summary
    code, out, err = run(cli, "--config", CONFIG, "check")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert [line.split()[0] for line in lines[:5]] == ["ok"] * 5
    assert lines[-1] == "every part answered"
    assert postfix.queue_is_empty()  # no mail was sent


def test_smtp_sign_in_with_a_right_and_a_wrong_password(
    cli: CliRunner, make_smtp_sink: Callable[..., SmtpSink], public_server: _HealthServer
) -> None:
    sink = make_smtp_sink(auth=("campaigns", "Right-Pass-1"))
    mailer = f"smtp://campaigns:Right-Pass-1@127.0.0.1:{sink.port}?security=none"
    assert init(cli, public_url=base_url(public_server), mailer=mailer)[0] == 0
    code, out, err = run(
        cli, "--config", CONFIG, "sender", "add", "--email", "sales@example.com",
        "--mailer", f"smtp://campaigns:Wrong-Pass-2@127.0.0.1:{sink.port}?security=none",
    )  # fmt: skip
    assert code == 0, err

    code, results, printed = checked(cli)

    assert code == 1
    assert results["mailer"]["status"] == "ok"
    assert "AUTH as campaigns" in results["mailer"]["detail"]
    wrong = results["sender sales@example.com"]
    assert wrong["status"] == "failed"
    assert wrong["target"] == f"smtp://campaigns:***@127.0.0.1:{sink.port}"
    assert f"SMTP 127.0.0.1:{sink.port} AUTH failed: 535" in wrong["detail"]
    assert "Right-Pass-1" not in printed and "Wrong-Pass-2" not in printed
    assert sink.messages == []
    code, out, _ = run(cli, "--config", CONFIG, "check", "--timeout", "5")
    assert code == 1
    [line] = [line for line in out.splitlines() if "sales@example.com" in line]
    assert line.startswith("failed") and "535" in line
    assert out.splitlines()[-1] == "1 of 6 parts failed"


def test_imap_sign_in_with_a_wrong_password_fails(
    cli: CliRunner, dovecot: Dovecot, smtp_sink: SmtpSink, public_server: _HealthServer
) -> None:
    code, _, err = init(
        cli,
        public_url=base_url(public_server),
        mailer=f"smtp://127.0.0.1:{smtp_sink.port}?security=none",
        feedback_imap=dovecot.url.replace(dovecot.password, "Wrong-Imap-3"),
    )
    assert code == 0, err

    code, results, printed = checked(cli)

    assert code == 1
    mailbox = results["feedback mailbox"]
    assert mailbox["status"] == "failed"
    assert mailbox["target"] == f"imap://bounces@127.0.0.1:{dovecot.port}/INBOX"
    assert "signing in failed" in mailbox["detail"]
    assert "Wrong-Imap-3" not in printed
    assert [part for part, r in results.items() if r["status"] == "failed"] == ["feedback mailbox"]


@pytest.mark.postgres
def test_an_unreachable_store_fails_and_the_environment_overrides_the_file(
    cli: CliRunner,
    postgres_url: str,
    smtp_sink: SmtpSink,
    public_server: _HealthServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mailer = f"smtp://127.0.0.1:{smtp_sink.port}?security=none"
    public = base_url(public_server)
    assert init(cli, public_url=public, mailer=mailer, database_url=postgres_url)[0] == 0
    assert checked(cli)[0] == 0
    port = free_port()
    monkeypatch.setenv(
        "SENDQUEUE_DATABASE_URL", f"postgresql+psycopg://postgres:Db-Pass-4@127.0.0.1:{port}/sq"
    )

    code, results, printed = checked(cli)

    assert code == 1
    store = results["task store"]
    assert store["target"] == f"postgresql+psycopg://postgres:***@127.0.0.1:{port}/sq"
    assert store["status"] == "failed" and "Connection refused" in store["detail"]
    assert results["senders"]["status"] == "not checked"
    assert [part for part, r in results.items() if r["status"] == "failed"] == ["task store"]
    assert "Db-Pass-4" not in printed


@pytest.mark.postgres
def test_the_procrastinate_layer_answers_on_the_store_s_database(
    cli: CliRunner,
    postgres_url: str,
    smtp_sink: SmtpSink,
    public_server: _HealthServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mailer = f"smtp://127.0.0.1:{smtp_sink.port}?security=none"
    public = base_url(public_server)
    assert init(cli, public_url=public, mailer=mailer, database_url=postgres_url)[0] == 0
    monkeypatch.setenv("SENDQUEUE_EXECUTION", "procrastinate")

    code, results, printed = checked(cli)

    assert code == 0, printed
    scheduler = results["scheduler"]
    assert scheduler["target"] == f"procrastinate on {postgres_url}"
    assert (scheduler["status"], scheduler["detail"]) == ("ok", "answered")
    port = free_port()
    monkeypatch.setenv(
        "SENDQUEUE_DATABASE_URL", f"postgresql+psycopg://postgres@127.0.0.1:{port}/x"
    )
    code, results, printed = checked(cli)
    assert code == 1
    assert results["scheduler"]["status"] == "failed"
    assert "Connection refused" in results["scheduler"]["detail"]


def test_the_public_url_answering_closed_redirecting_and_overridden(
    cli: CliRunner,
    public_server: _HealthServer,
    smtp_sink: SmtpSink,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    mailer = f"smtp://127.0.0.1:{smtp_sink.port}?security=none"
    assert init(cli, public_url=closed, mailer=mailer)[0] == 0

    code, results, _ = checked(cli)
    assert code == 1
    assert results["public URL"]["target"] == f"{closed}/healthz"
    assert results["public URL"]["status"] == "failed"
    assert "Connection refused" in results["public URL"]["detail"]

    monkeypatch.setenv("SENDQUEUE_PUBLIC_URL", base_url(public_server))  # over the file's
    code, results, printed = checked(cli)
    assert code == 0, printed
    assert results["public URL"] == {
        "part": "public URL",
        "target": f"{base_url(public_server)}/healthz",
        "status": "ok",
        "detail": f"GET {base_url(public_server)}/healthz: 200",
    }

    public_server.answer = (301, b"", {"Location": "https://elsewhere.example/healthz"})
    code, results, _ = checked(cli)
    assert code == 1
    assert (
        "a redirect to https://elsewhere.example/healthz (not followed)"
        in (results["public URL"]["detail"])
    )
    public_server.answer = (200, b"<html>placeholder</html>", {"Content-Type": "text/html"})
    code, results, _ = checked(cli)
    assert code == 1
    assert "not sendqueue's health answer" in results["public URL"]["detail"]
