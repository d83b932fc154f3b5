"""``sendqueue init`` (a commented settings file for real outreach, and its first sender) and
``sendqueue check`` (every configured part tried for real).

``init`` asks for each value it is not given as a flag (``--no-input``: never asks; the optional
ones are then left out), checks every answer with the settings' own rules (a refused flag is
named, and nothing is written), generates the secret key and the API token, adds the first
sender through the same service as ``sendqueue sender add``, and writes the file with mode
0600 (see :mod:`sendqueue.settings.file`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.text import Text

from sendqueue.cli.common import (
    JsonOpt,
    container,
    fail,
    given_config,
    handle_errors,
    out,
    print_json,
)
from sendqueue.domain.errors import Conflict, InfrastructureError, InvalidField, InvalidSettings
from sendqueue.domain.senders import DEFAULT_DAILY_CAP, Sender, new_sender_id
from sendqueue.domain.wording import plural
from sendqueue.settings import redact_url
from sendqueue.settings.file import (
    DEFAULT_CONFIG,
    check_settings,
    install_config,
    load_settings,
    read_config,
    render_config,
    staged_config,
)

__all__ = ["check_cmd", "init_cmd"]


@dataclass(frozen=True)
class _Asked:
    """A setting ``init`` asks for when its flag is not given."""

    flag: str
    variable: str
    prompt: str
    required: bool


_ASKED = (
    _Asked(
        "--public-url",
        "SENDQUEUE_PUBLIC_URL",
        "Public URL, where recipients reach this server (https://mail.example.com)",
        True,
    ),
    _Asked(
        "--mailer",
        "SENDQUEUE_MAILER",
        "SMTP mailer (smtp://user:password@smtp.example.com:587?security=starttls)",
        True,
    ),
    _Asked(
        "--bounce-address",
        "SENDQUEUE_BOUNCE_ADDRESS",
        "Bounce address, the Return-Path of every email (empty: none)",
        False,
    ),
    _Asked(
        "--feedback-imap",
        "SENDQUEUE_FEEDBACK_IMAP",
        "Feedback mailbox (imaps://user:password@imap.example.com/INBOX; empty: none)",
        False,
    ),
)
#: Every flag that sets a variable, for the errors that name a variable.
_FLAGS = {
    **{a.variable: a.flag for a in _ASKED},
    "SENDQUEUE_TRUSTED_AUTHSERV": "--trusted-authserv",
    "SENDQUEUE_DATABASE_URL": "--database-url",
    "SENDQUEUE_ENVIRONMENT": "--environment",
    "SENDQUEUE_DEFAULT_FROM": "--sender-email",
}
_SENDER_FLAGS = {
    "email": "--sender-email",
    "name": "--sender-name",
    "daily_cap": "--sender-daily-cap",
}
#: Written commented out (with their defaults) when not set.
_OPTIONAL = (
    "SENDQUEUE_BOUNCE_ADDRESS",
    "SENDQUEUE_FEEDBACK_IMAP",
    "SENDQUEUE_TRUSTED_AUTHSERV",
    "SENDQUEUE_UNSUBSCRIBE_MAILBOX",
    "SENDQUEUE_DATABASE_URL",
    "SENDQUEUE_SCHEDULER_URL",
    "SENDQUEUE_EXECUTION",
    "SENDQUEUE_DEFAULT_TIMEZONE",
    "SENDQUEUE_ALARM_EMAIL",
    "SENDQUEUE_ALARM_WEBHOOK",
    "SENDQUEUE_ALLOWED_HOSTS",
    "SENDQUEUE_FORWARDED_ALLOW_IPS",
    "SENDQUEUE_SUPPRESS_REPLIES",
)
_SECRETS = ("SENDQUEUE_SECRET_KEY", "SENDQUEUE_API_TOKEN")
_HEADER = (
    "sendqueue settings, written by `sendqueue init`.",
    "Every command reads this file (another one: --config PATH or SENDQUEUE_CONFIG); a variable",
    "set in the environment overrides the same one here. Keep it private (mode 0600): it holds",
    "the secret key, the API token and the mail passwords. Try every part: sendqueue check",
)


def _refused(named: str, reason: str) -> NoReturn:
    fail(2, f"{named}: {reason}; nothing written")


def _named(variable: str) -> str:
    """How an error names a variable: with the flag that sets it."""
    flag = _FLAGS.get(variable)
    return f"{flag} ({variable})" if flag else variable


@dataclass(frozen=True)
class _Question:
    """One value ``init`` takes as a flag or asks for; ``check`` returns it cleaned, or raises
    InvalidField with the reason."""

    flag: str
    named: str
    prompt: str
    check: Callable[[str], str]
    #: None: required; otherwise what an empty answer (or --no-input) gives.
    default: str | None = None


class _Answers:
    """Flags, else answers to prompts (none with ``no_input``). A refused flag exits 2 naming
    it; a refused answer is asked again."""

    def __init__(self, *, no_input: bool) -> None:
        self.no_input = no_input

    def get(self, question: _Question, given: str | None) -> str:
        if given is not None:
            try:
                return question.check(given)
            except InvalidField as exc:
                _refused(question.named, exc.reason)
        if self.no_input:
            if question.default is None:
                _refused(question.flag, "required (with --no-input nothing is asked)")
            return question.default

        def proc(value: str) -> str:
            try:
                return question.check(value)
            except InvalidField as exc:
                raise typer.BadParameter(exc.reason) from None

        try:
            answer: str = typer.prompt(
                question.prompt,
                default=question.default,
                show_default=bool(question.default),
                value_proc=proc,
                err=True,
            )
        except typer.Abort:
            _refused(
                question.flag,
                f"no answer (stdin is closed): give {question.flag} VALUE, or --no-input to leave "
                "the optional ones out",
            )
        return answer


#: Stand-ins for the required values not known yet while one answer is checked on its own.
_STAND_INS = {
    "SENDQUEUE_PUBLIC_URL": "https://mail.example.com",
    "SENDQUEUE_MAILER": "smtp://smtp.example.com:587",
}


def _setting_question(asked: _Asked, known: dict[str, str]) -> _Question:
    """``asked`` checked with the settings' rules, in the environment chosen, next to the
    values ``known`` (the generated secrets) and stand-ins for the required ones still to
    come: an http:// public URL or a Maildir mailer is refused (and asked again) in production
    at once, not after the last question."""
    context = {**_STAND_INS, **known}

    def check(value: str) -> str:
        value = value.strip()
        if not value and asked.required:
            raise InvalidField(asked.variable, value, "required")
        if value:
            check_settings({**context, asked.variable: value})
        return value

    return _Question(
        asked.flag, _named(asked.variable), asked.prompt, check, None if asked.required else ""
    )


def _sender_questions() -> tuple[_Question, _Question, _Question]:
    """The first sender's address, name and daily cap, each checked with the senders' own
    rules (a Sender value is made of it; stored later, by the service)."""

    def sender(**fields: Any) -> Sender:
        return Sender(id=new_sender_id(), **{"email": "check@example.com", **fields})

    def email(value: str) -> str:
        return sender(email=value).email

    def name(value: str) -> str:
        return sender(name=value.strip()).name

    def cap(value: str) -> str:
        try:
            number = int(value.strip())
        except ValueError:
            raise InvalidField("daily_cap", value, "expected a whole number") from None
        return str(sender(daily_cap=number).daily_cap)

    return (
        _Question("--sender-email", "--sender-email", "The first sender's address", email),
        _Question("--sender-name", "--sender-name", "Its display name (empty: none)", name, ""),
        _Question(
            "--sender-daily-cap",
            "--sender-daily-cap",
            "Its daily cap (emails a day at most)",
            cap,
            str(DEFAULT_DAILY_CAP),
        ),
    )


def _secrets(path: Path, *, force: bool) -> tuple[dict[str, str], set[str]]:
    """A new secret key and API token, and which of them are kept instead: with ``force``, the
    ones of the file being replaced, when they pass the settings' rules (a new key would break
    the unsubscribe links and bounce addresses of every email already sent)."""
    made = {
        "SENDQUEUE_SECRET_KEY": secrets.token_hex(32),
        "SENDQUEUE_API_TOKEN": secrets.token_urlsafe(32),
    }
    kept: set[str] = set()
    if not (force and path.is_file()):
        return made, kept
    old = read_config(path)
    for variable in _SECRETS:
        value = old.get(variable)
        if not value:
            continue
        try:
            check_settings({variable: value})
        except InvalidField:
            continue  # one the settings would refuse is replaced
        made[variable] = value
        kept.add(variable)
    return made, kept


PublicUrlOpt = Annotated[
    str | None, typer.Option("--public-url", help="SENDQUEUE_PUBLIC_URL: https://...")
]
MailerOpt = Annotated[
    str | None,
    typer.Option("--mailer", help="SENDQUEUE_MAILER: smtp://user:pass@host:587?security=..."),
]
BounceOpt = Annotated[
    str | None, typer.Option("--bounce-address", help="SENDQUEUE_BOUNCE_ADDRESS ('': none)")
]
FeedbackOpt = Annotated[
    str | None,
    typer.Option("--feedback-imap", help="SENDQUEUE_FEEDBACK_IMAP: imaps://... ('': none)"),
]
AuthservOpt = Annotated[
    str | None, typer.Option("--trusted-authserv", help="SENDQUEUE_TRUSTED_AUTHSERV (not asked)")
]
DatabaseOpt = Annotated[
    str | None, typer.Option("--database-url", help="SENDQUEUE_DATABASE_URL (not asked)")
]
SenderEmailOpt = Annotated[
    str | None, typer.Option("--sender-email", help="The first sender's address.")
]
SenderNameOpt = Annotated[str | None, typer.Option("--sender-name", help="Its display name.")]
SenderCapOpt = Annotated[
    int | None, typer.Option("--sender-daily-cap", help="Its daily cap (default 50).")
]
EnvironmentOpt = Annotated[
    str,
    typer.Option(
        "--environment",
        help="SENDQUEUE_ENVIRONMENT: production (refuses unsafe settings) or development.",
    ),
]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force", help="Replace an existing file (keeping its secret key and API token)."
    ),
]
NoInputOpt = Annotated[
    bool, typer.Option("--no-input", help="Ask nothing: flags only (scripts, CI).")
]


@handle_errors
def init_cmd(
    public_url: PublicUrlOpt = None,
    mailer: MailerOpt = None,
    bounce_address: BounceOpt = None,
    feedback_imap: FeedbackOpt = None,
    trusted_authserv: AuthservOpt = None,
    database_url: DatabaseOpt = None,
    sender_email: SenderEmailOpt = None,
    sender_name: SenderNameOpt = None,
    sender_daily_cap: SenderCapOpt = None,
    environment: EnvironmentOpt = "production",
    force: ForceOpt = False,
    no_input: NoInputOpt = False,
) -> None:
    """Write a settings file for real outreach and add the first sender.

    The file (./sendqueue.env, or --config PATH) is commented, private (mode 0600) and holds a
    new secret key and API token; every value not given as a flag is asked for."""
    path = Path(given_config() or DEFAULT_CONFIG)
    if path.exists() and not force:
        fail(
            1,
            f"{path} exists: not overwritten (--force replaces it, keeping its secret key and "
            "API token)",
        )
    values, kept = _secrets(path, force=force)
    values = {"SENDQUEUE_ENVIRONMENT": environment, **values}
    try:
        check_settings({**_STAND_INS, **values})
    except InvalidField as exc:
        _refused(_named(exc.field), exc.reason)
    answers = _Answers(no_input=no_input)
    given = (public_url, mailer, bounce_address, feedback_imap)
    for asked, flag in zip(_ASKED, given, strict=True):
        value = answers.get(_setting_question(asked, values), flag)
        if value:
            values[asked.variable] = value
    for variable, flag in (
        ("SENDQUEUE_TRUSTED_AUTHSERV", trusted_authserv),
        ("SENDQUEUE_DATABASE_URL", database_url),
    ):
        if flag:
            values[variable] = flag.strip()
    cap = None if sender_daily_cap is None else str(sender_daily_cap)
    email, name, daily = (
        answers.get(question, flag)
        for question, flag in zip(
            _sender_questions(), (sender_email, sender_name, cap), strict=True
        )
    )
    values["SENDQUEUE_DEFAULT_FROM"] = email
    try:
        check_settings(values)
        text = render_config(values, _OPTIONAL, header=_HEADER)
    except InvalidField as exc:
        _refused(_named(exc.field), exc.reason)
    sender, added = _write(path, text, force=force, email=email, name=name, cap=int(daily))
    _report(path, values, kept, sender, added)


def _write(
    path: Path, text: str, *, force: bool, email: str, name: str, cap: int
) -> tuple[Sender, bool]:
    """Read the file back as every command will (under the environment), add the sender to
    that store, then put the file in place. Whether the sender was added (False: an existing
    one with its address is kept)."""
    with staged_config(path, text) as staged:
        try:
            settings = load_settings(staged)
        except InvalidSettings as exc:  # the environment overrides a value of the file
            lines = "; ".join(exc.problems)
            fail(2, f"the file would be refused under this environment: {lines}; nothing written")
        try:
            with container(settings) as c:
                try:
                    sender, added = c.senders.add(email=email, name=name, daily_cap=cap), True
                except Conflict:
                    sender, added = c.senders.get(email), False
        except InvalidField as exc:
            _refused(_SENDER_FLAGS.get(exc.field, exc.field), exc.reason)
        except InfrastructureError as exc:
            fail(3, f"the task store: {type(exc).__name__}: {exc}; nothing written")
        try:
            install_config(staged, path, force=force)
        except FileExistsError:
            fail(1, f"{path} was written by someone else meanwhile: not overwritten")
    return sender, added


def _shown(variable: str, value: str, kept: set[str]) -> str:
    if variable in _SECRETS:
        return "*** (kept)" if variable in kept else "*** (new)"
    return redact_url(value) if "://" in value else value


def _report(
    path: Path, values: dict[str, str], kept: set[str], sender: Sender, added: bool
) -> None:
    out.print(f"wrote {path} (mode 0600):", markup=False)
    for variable, value in values.items():
        out.print(f"  {variable}={_shown(variable, value, kept)}", markup=False)
    if added:
        out.print(
            f"added sender {sender.id} ({sender.email}): {sender.daily_cap} a day", markup=False
        )
    else:
        out.print(
            f"sender {sender.id} ({sender.email}) was there already: kept as it is "
            "(change it with `sendqueue sender update`)",
            markup=False,
        )
    out.print(
        f"log in to the web UI with SENDQUEUE_API_TOKEN (in {path}); next, try every part:",
        markup=False,
    )
    config = "" if path == DEFAULT_CONFIG else f" --config {path}"
    out.print(f"  sendqueue{config} check", markup=False)


_STYLES = {"ok": "green", "failed": "bold red", "not checked": "yellow"}


@handle_errors
def check_cmd(
    timeout: Annotated[
        float,
        typer.Option("--timeout", min=0.1, max=300, help="Seconds each part may take to answer."),
    ] = 10.0,
    as_json: JsonOpt = False,
) -> None:
    """Try each configured part for real; exit 1 when any fails.

    SMTP sign-in (the mailer, each sender's own transport), IMAP sign-in (the feedback
    mailbox), the public URL's /healthz, the task store and the execution layer. No mail is
    sent, nothing in a mailbox changes."""
    with container() as c:
        results = c.setup_check.run(timeout)
    if as_json:
        print_json([r.as_dict() for r in results])
    else:
        for r in results:
            line = Text(f"{r.status:<12}", style=_STYLES[r.status])
            where = f" ({r.target})" if r.target else ""
            line.append(f"{r.part}{where}: {r.detail}")
            out.print(line, soft_wrap=True)
        failed = sum(r.failed for r in results)
        out.print(
            f"{failed} of {plural(len(results), 'part')} failed"
            if failed
            else "every part answered"
        )
    if any(r.failed for r in results):
        raise typer.Exit(1)
