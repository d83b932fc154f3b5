"""``sendqueue sender``: the mailboxes campaigns send from, their caps and their usage.

A sender is named by its id or its address. Its transport (``--mailer``) and its mailbox
(``--imap``) may hold a password, its OAuth grant a refresh token and a client secret: every
output shows them masked (``smtp://user:***@host:587``, ``"refresh_token": "***"``), as the API
and the pages do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from sendqueue.cli.common import JsonOpt, container, fail, handle_errors, out, print_json
from sendqueue.domain.errors import Conflict, InvalidField
from sendqueue.domain.feedback import MailboxState
from sendqueue.domain.senders import DEFAULT_DAILY_CAP, DEFAULT_MIN_GAP_SECONDS, Sender
from sendqueue.domain.wording import plural
from sendqueue.services.feedback.mailboxes import mailbox_dict
from sendqueue.services.senders.service import USAGE_DAYS, DayUsage, SenderView

__all__ = ["sender_app", "sender_dict", "usage_rows"]

sender_app = typer.Typer(
    help="Senders: the mailboxes campaigns send from, each with a daily cap, a minimum gap "
    "between sends and an optional warm-up.",
    no_args_is_help=True,
)

RefArg = Annotated[str, typer.Argument(help="The sender's id or address.")]
_NAME_HELP = "Display name of the From header."
_CAP_HELP = "Emails a day at most, counted per local day in the sender's timezone (1..10000)."
_GAP_HELP = "Seconds between two sends of this sender at least (1..86400)."
_ZONE_HELP = "IANA timezone of the sender's days [default: SENDQUEUE_DEFAULT_TIMEZONE]"
_WARMUP_START_HELP = (
    "Warm-up: the cap on its first sending day (its first day with an email); needs --warmup-step."
)
_WARMUP_STEP_HELP = "Warm-up: how much the cap grows per sending day, up to --daily-cap."
_MAILER_HELP = (
    "Its own transport (smtp://user:password@host:587?security=starttls, ses:REGION, "
    "maildir:PATH) [default: SENDQUEUE_MAILER]"
)


_IMAP_HELP = (
    "Its own mailbox, read for its replies and bounces: imaps://user:password@host:993/INBOX "
    "(imap://...?security=starttls|tls|none, as SENDQUEUE_FEEDBACK_IMAP)"
)
ImapOpt = Annotated[str | None, typer.Option("--imap", help=_IMAP_HELP)]
SignatureOpt = Annotated[
    str | None,
    typer.Option("--signature", help="Its signature as text (templates' sender.signature)."),
]
SignatureFileOpt = Annotated[
    Path | None,
    typer.Option("--signature-file", help="Read the text signature from a file (UTF-8)."),
]
SignatureHtmlFileOpt = Annotated[
    Path | None,
    typer.Option("--signature-html-file", help="Read the HTML signature from a file (UTF-8)."),
]
TokenUrlOpt = Annotated[
    str | None, typer.Option("--oauth-token-url", help="OAuth 2.0: the provider's token endpoint.")
]
ClientIdOpt = Annotated[
    str | None, typer.Option("--oauth-client-id", help="OAuth 2.0: the client id.")
]
ClientSecretOpt = Annotated[
    str | None,
    typer.Option("--oauth-client-secret", help="OAuth 2.0: the client secret (never shown again)."),
]
RefreshTokenOpt = Annotated[
    str | None,
    typer.Option("--oauth-refresh-token", help="OAuth 2.0: the refresh token (never shown again)."),
]
ScopeOpt = Annotated[
    str | None, typer.Option("--oauth-scope", help="OAuth 2.0: the scope asked for.")
]


def _read_text(path: Path | None, field: str) -> str | None:
    """A signature file's text; InvalidField naming ``field`` when it cannot be read."""
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise InvalidField(field, str(path), f"cannot be read: {reason}") from None


def _signature(text: str | None, path: Path | None) -> str | None:
    """``--signature`` or ``--signature-file`` (not both)."""
    if text is not None and path is not None:
        raise InvalidField("signature_text", None, "give --signature or --signature-file, not both")
    return text if text is not None else _read_text(path, "signature_text")


def _oauth(**given: str | None) -> dict[str, str | None]:
    """The OAuth options given (``token_url``, ...), for the service."""
    return {name: value for name, value in given.items() if value is not None}


def sender_dict(sender: Sender) -> dict[str, Any]:
    """A sender as ``--json`` prints it: the transport masked."""
    return SenderView.of(sender).as_dict()


def usage_rows(usage: list[DayUsage]) -> list[dict[str, Any]]:
    """Per-day usage as ``show --json`` prints it."""
    return [
        {"date": d.date.isoformat(), "planned": d.planned, "sent": d.sent, "cap": d.cap}
        for d in usage
    ]


def _warmup_text(view: SenderView) -> str:
    if view.warmup_start is None:
        return ""
    since = view.warmup_from.isoformat() if view.warmup_from else "?"
    return f"{view.warmup_start} +{view.warmup_step} per sending day, counted from {since}"


def _profile_lines(view: SenderView) -> list[str]:
    """What ``show`` says of the sender's mailbox, signature and OAuth grant (masked)."""
    forms = [
        name
        for name, value in (("text", view.signature_text), ("HTML", view.signature_html))
        if value
    ]
    lines = [
        f"imap: {view.imap or '(none: only the feedback mailbox)'}",
        f"signature: {' and '.join(forms) if forms else 'none'}",
    ]
    if view.oauth is not None:
        grant = ", ".join(
            f"{key}: {value}" for key, value in view.oauth.items() if value is not None
        )
        lines.append(f"oauth: {grant}")
    return lines


def _address_taken(exc: Conflict) -> None:
    """A taken address is the email field's problem: say so, as every other bad input does."""
    fail(1, f"email: {exc}")


@sender_app.command("add")
@handle_errors
def sender_add(
    email: Annotated[str, typer.Option("--email", help="The address it sends from.")],
    name: Annotated[str, typer.Option("--name", help=_NAME_HELP)] = "",
    daily_cap: Annotated[int, typer.Option("--daily-cap", help=_CAP_HELP)] = DEFAULT_DAILY_CAP,
    min_gap: Annotated[int, typer.Option("--min-gap", help=_GAP_HELP)] = DEFAULT_MIN_GAP_SECONDS,
    timezone: Annotated[str | None, typer.Option("--timezone", help=_ZONE_HELP)] = None,
    warmup_start: Annotated[
        int | None, typer.Option("--warmup-start", help=_WARMUP_START_HELP)
    ] = None,
    warmup_step: Annotated[
        int | None, typer.Option("--warmup-step", help=_WARMUP_STEP_HELP)
    ] = None,
    mailer: Annotated[str | None, typer.Option("--mailer", help=_MAILER_HELP)] = None,
    reply_to: Annotated[str | None, typer.Option("--reply-to", help="Reply-To address.")] = None,
    imap: ImapOpt = None,
    signature: SignatureOpt = None,
    signature_file: SignatureFileOpt = None,
    signature_html_file: SignatureHtmlFileOpt = None,
    oauth_token_url: TokenUrlOpt = None,
    oauth_client_id: ClientIdOpt = None,
    oauth_client_secret: ClientSecretOpt = None,
    oauth_refresh_token: RefreshTokenOpt = None,
    oauth_scope: ScopeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Add a sender (nothing is stored if any option is invalid)."""
    oauth = _oauth(
        token_url=oauth_token_url,
        client_id=oauth_client_id,
        client_secret=oauth_client_secret,
        refresh_token=oauth_refresh_token,
        scope=oauth_scope,
    )
    text = _signature(signature, signature_file)
    html = _read_text(signature_html_file, "signature_html")
    with container() as c:
        try:
            sender = c.senders.add(
                email=email,
                name=name,
                daily_cap=daily_cap,
                min_gap_seconds=min_gap,
                timezone=timezone,
                warmup_start=warmup_start,
                warmup_step=warmup_step,
                transport=mailer,
                reply_to=reply_to,
                imap=imap,
                signature_text=text or "",
                signature_html=html,
                oauth=oauth or None,
            )
        except Conflict as exc:
            _address_taken(exc)
    data = sender_dict(sender)
    if as_json:
        print_json(data)
        return
    out.print(
        f"added sender {sender.id} ({sender.email}): {sender.daily_cap} a day, "
        f"{sender.min_gap_seconds} s apart, days in {sender.timezone}",
        markup=False,
    )
    if data["warmup_start"] is not None:
        out.print(f"warm-up: {_warmup_text(SenderView.of(sender))}", markup=False)


@sender_app.command("list")
@handle_errors
def sender_list(as_json: JsonOpt = False) -> None:
    """Every sender, by address."""
    with container() as c:
        views = [SenderView.of(s) for s in c.senders.all()]
    if as_json:
        print_json([v.as_dict() for v in views])
        return
    table = Table(title=plural(len(views), "sender"))
    for col in ("id", "email", "name", "cap/day", "gap (s)", "timezone", "warm-up", "transport"):
        table.add_column(col, justify="right" if col in {"cap/day", "gap (s)"} else "left")
    for v in views:
        # Text cells: what users typed is never read as console markup
        table.add_row(
            *(
                Text(cell)
                for cell in (
                    v.id,
                    v.email,
                    v.name,
                    str(v.daily_cap),
                    str(v.min_gap_seconds),
                    v.timezone,
                    _warmup_text(v),
                    v.transport or "(default mailer)",
                )
            )
        )
    out.print(table)


def _mailbox_lines(state: MailboxState | None) -> list[str]:
    """The sender's own mailbox as ``show`` prints it: its last pass, messages, last error."""
    if state is None:
        return ["mailbox: none (replies are read from the feedback mailbox only)"]
    if state.polled_at is None:
        lines = [f"mailbox: {state.mailbox}, not read yet"]
    else:
        polled = state.polled_at.strftime("%Y-%m-%d %H:%M:%S UTC")
        read = plural(state.messages_read, "message")
        lines = [f"mailbox: {state.mailbox}, last read {polled}, {read} read in all"]
    if state.last_error:
        lines.append(f"mailbox error: {state.last_error}")
    return lines


@sender_app.command("show")
@handle_errors
def sender_show(
    ref: RefArg,
    days: Annotated[int, typer.Option("--days", help="Days of usage from today.")] = USAGE_DAYS,
    as_json: JsonOpt = False,
) -> None:
    """One sender, with its planned and sent emails against its cap per local day."""
    with container() as c:
        sender = c.senders.get(ref)
        usage = c.senders.usage(sender.id, days=days)
        mailbox = c.mailboxes.states_of([sender]).get(sender.id)
    view = SenderView.of(sender)
    if as_json:
        shown = mailbox_dict(mailbox) if mailbox else None
        print_json({**view.as_dict(), "usage": usage_rows(usage), "mailbox": shown})
        return
    out.print(f"{view.email} ({view.id})" + (f" {view.name}" if view.name else ""), markup=False)
    out.print(
        f"cap: {view.daily_cap} a day, at least {view.min_gap_seconds} s apart, "
        f"days in {view.timezone}",
        markup=False,
    )
    if view.warmup_start is not None:
        out.print(f"warm-up: {_warmup_text(view)}", markup=False)
    out.print(f"transport: {view.transport or '(default mailer)'}", markup=False)
    if view.reply_to:
        out.print(f"reply-to: {view.reply_to}", markup=False)
    for line in _profile_lines(view):
        out.print(line, markup=False)
    for line in _mailbox_lines(mailbox):
        out.print(line, markup=False, soft_wrap=True)
    table = Table(title=f"usage over {plural(len(usage), 'day')} ({view.timezone})")
    for col in ("date", "planned", "sent", "cap", "free"):
        table.add_column(col, justify="left" if col == "date" else "right")
    for d in usage:
        table.add_row(
            d.date.strftime("%a %Y-%m-%d"),
            str(d.planned),
            str(d.sent),
            str(d.cap),
            str(max(0, d.cap - d.planned - d.sent)),
        )
    out.print(table)


def _signature_changes(
    text: str | None, path: Path | None, html_path: Path | None, remove: bool
) -> dict[str, object]:
    """The signature fields ``update`` changes."""
    changes: dict[str, object] = {}
    if remove:
        if text is not None or path is not None or html_path is not None:
            raise InvalidField("signature_text", None, "--no-signature removes the signature")
        return {"signature_text": "", "signature_html": None}
    new_text = _signature(text, path)
    if new_text is not None:
        changes["signature_text"] = new_text
    if html_path is not None:
        changes["signature_html"] = _read_text(html_path, "signature_html")
    return changes


RestartWarmupOpt = Annotated[
    int | None,
    typer.Option(
        "--warmup-start", help="Restart the warm-up at this cap (earlier days stop counting)."
    ),
]
NoWarmupOpt = Annotated[
    bool, typer.Option("--no-warmup", help="End the warm-up: the full cap from today.")
]
NewMailerOpt = Annotated[
    str | None, typer.Option("--mailer", help="A new transport; '' for the default mailer.")
]
NewReplyToOpt = Annotated[
    str | None, typer.Option("--reply-to", help="A new Reply-To; '' for none.")
]
NewImapOpt = Annotated[str | None, typer.Option("--imap", help="A new mailbox URL; '' for none.")]
NoSignatureOpt = Annotated[
    bool, typer.Option("--no-signature", help="Remove the signature (text and HTML).")
]
NoOAuthOpt = Annotated[
    bool, typer.Option("--no-oauth", help="Remove the OAuth grant: the URLs' passwords.")
]


def _oauth_changes(oauth: dict[str, str | None], remove: bool) -> dict[str, object]:
    """The grant's change ``update`` makes: the fields given, or none with ``--no-oauth``."""
    if remove and oauth:
        raise InvalidField("oauth", None, "--no-oauth removes the grant; give no --oauth-* with it")
    return {"oauth": oauth or None} if oauth or remove else {}


@sender_app.command("update")
@handle_errors
def sender_update(
    ref: RefArg,
    email: Annotated[str | None, typer.Option("--email", help="A new address.")] = None,
    name: Annotated[str | None, typer.Option("--name", help=_NAME_HELP)] = None,
    daily_cap: Annotated[int | None, typer.Option("--daily-cap", help=_CAP_HELP)] = None,
    min_gap: Annotated[int | None, typer.Option("--min-gap", help=_GAP_HELP)] = None,
    timezone: Annotated[str | None, typer.Option("--timezone", help="IANA timezone.")] = None,
    warmup_start: RestartWarmupOpt = None,
    warmup_step: Annotated[
        int | None, typer.Option("--warmup-step", help=_WARMUP_STEP_HELP)
    ] = None,
    no_warmup: NoWarmupOpt = False,
    mailer: NewMailerOpt = None,
    reply_to: NewReplyToOpt = None,
    imap: NewImapOpt = None,
    signature: SignatureOpt = None,
    signature_file: SignatureFileOpt = None,
    signature_html_file: SignatureHtmlFileOpt = None,
    no_signature: NoSignatureOpt = False,
    oauth_token_url: TokenUrlOpt = None,
    oauth_client_id: ClientIdOpt = None,
    oauth_client_secret: ClientSecretOpt = None,
    oauth_refresh_token: RefreshTokenOpt = None,
    oauth_scope: ScopeOpt = None,
    no_oauth: NoOAuthOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Change some of a sender's settings; the others stay as they are (the --oauth-* options
    given replace those fields of the grant and keep its others)."""
    given = {
        "email": email,
        "name": name,
        "daily_cap": daily_cap,
        "min_gap_seconds": min_gap,
        "timezone": timezone,
        "warmup_start": warmup_start,
        "warmup_step": warmup_step,
    }
    changes: dict[str, object] = {key: value for key, value in given.items() if value is not None}
    # '' clears an optional setting
    if mailer is not None:
        changes["transport"] = mailer or None
    if reply_to is not None:
        changes["reply_to"] = reply_to or None
    if no_warmup:
        if warmup_start is not None or warmup_step is not None:
            raise InvalidField("warmup_start", warmup_start, "--no-warmup ends the warm-up")
        changes["warmup_start"] = changes["warmup_step"] = None
    if imap is not None:
        changes["imap"] = imap or None
    changes.update(_signature_changes(signature, signature_file, signature_html_file, no_signature))
    oauth = _oauth(
        token_url=oauth_token_url,
        client_id=oauth_client_id,
        client_secret=oauth_client_secret,
        refresh_token=oauth_refresh_token,
        scope=oauth_scope,
    )
    changes.update(_oauth_changes(oauth, no_oauth))
    if not changes:
        raise InvalidField("changes", None, "nothing to change: give at least one option")
    with container() as c:
        try:
            sender = c.senders.update(ref, changes)
        except Conflict as exc:
            _address_taken(exc)
    if as_json:
        print_json(sender_dict(sender))
        return
    out.print(
        f"updated sender {sender.id} ({sender.email}): {', '.join(sorted(changes))}", markup=False
    )


@sender_app.command("remove")
@handle_errors
def sender_remove(ref: RefArg, as_json: JsonOpt = False) -> None:
    """Delete a sender (refused while it still has planned emails: cancel or re-plan them)."""
    with container() as c:
        sender = c.senders.remove(ref)
    if as_json:
        print_json({"removed": sender.id, "email": sender.email})
        return
    out.print(f"removed sender {sender.id} ({sender.email})", markup=False)
