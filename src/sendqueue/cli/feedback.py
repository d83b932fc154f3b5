"""``sendqueue feedback``: the feedback mailbox (bounces, complaints, replies)."""

from __future__ import annotations

import typer

from sendqueue.cli.common import JsonOpt, container, err, fail, handle_errors, out, print_json

__all__ = ["feedback_app"]

feedback_app = typer.Typer(
    help="The feedback mailbox: bounces, complaints and replies (SENDQUEUE_FEEDBACK_IMAP).",
    no_args_is_help=True,
)

_COUNTS = (
    "messages",
    "bounces",
    "soft_bounces",
    "complaints",
    "replies",
    "unsubscribes",
    "auto_replies",
    "not_feedback",
    "ignored",
    "unverified",
    "skipped",
)
_LABELS = {
    "unverified": "unverified replies (noted, nothing changed)",
    "auto_replies": "auto-replies with a return date",
}


@feedback_app.command("poll")
@handle_errors
def feedback_poll(as_json: JsonOpt = False) -> None:
    """Read the feedback mailbox and every sender's own mailbox once: apply every new bounce,
    complaint and reply, and print the counts ("skipped": messages whose parse failed or ran
    out of SENDQUEUE_FEEDBACK_PARSE_SECONDS; left alone, not read again). Exits 3 when a
    mailbox cannot be read (the others are read all the same)."""
    with container() as c:
        if not c.feedback_sources and not c.mailboxes.current():
            fail(
                2,
                "SENDQUEUE_FEEDBACK_IMAP is not set and no sender has a mailbox (imap): "
                "there is no mailbox to poll",
            )
        report = c.feedback_poller.poll()
    if as_json:
        print_json(report.as_dict())
    else:
        for key in _COUNTS:
            label = _LABELS.get(key, key.replace("_", " "))
            out.print(f"{label}: {getattr(report, key)}")
        for name in report.busy:
            out.print(f"{name}: another poller is reading it; skipped", markup=False)
    for error in report.errors:
        err.print(f"error: {error}", markup=False, soft_wrap=True)
    if report.errors:
        raise typer.Exit(3)
