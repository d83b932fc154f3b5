"""The composition root's part for ``sendqueue check``: the container's parts, lazily opened,
handed to :class:`~sendqueue.services.operations.checks.SetupCheck` with their masked targets and
every
secret of the settings. Apart from :mod:`sendqueue.bootstrap` only to keep each module short;
:attr:`sendqueue.bootstrap.Container.setup_check` is the way in."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from sendqueue.adapters.public_url import HEALTH_PATH, PublicUrlProbe
from sendqueue.bootstrap.feedback import open_sender_mailbox
from sendqueue.services.operations.checks import CheckedParts, SetupCheck, url_secrets
from sendqueue.settings import Settings, redact_url

if TYPE_CHECKING:
    from sendqueue.bootstrap import Container

__all__ = ["execution_target", "setup_check"]


def execution_target(settings: Settings) -> str:
    """Where the schedules live, without secrets (for ``check`` and the startup log lines)."""
    if settings.execution == "procrastinate":
        return f"procrastinate on {redact_url(settings.database_url)}"
    if settings.execution == "eventbridge":
        # SENDQUEUE_SCHEDULER_URL means nothing here: the schedules are in AWS.
        return f"EventBridge Scheduler group {settings.schedule_group}"
    return f"embedded, {redact_url(settings.scheduler_url)}"


def _secrets(s: Settings) -> set[str]:
    """Every password, key and token of the settings: masked wherever the check quotes."""
    found: set[str] = set()
    for url in (s.mailer, s.feedback_imap, s.database_url, s.scheduler_url):
        found |= url_secrets(url)
    for secret in (s.secret_key, s.api_token):
        if secret is not None:
            found.add(secret.get_secret_value())
    return found


def setup_check(c: Container) -> SetupCheck:
    """The check of everything ``c`` is configured with (nothing is opened until it runs)."""
    s = c.settings
    public: PublicUrlProbe | str = (
        PublicUrlProbe(s.public_url)
        if s.public_url
        else "SENDQUEUE_PUBLIC_URL is not set (no email carries an unsubscribe link)"
    )
    parts = CheckedParts(
        store=lambda: c.stores.changes,
        store_target=redact_url(s.database_url),
        senders=lambda: c.sender_store,
        scheduler=lambda: c.scheduler,
        scheduler_target=execution_target(s),
        mailer=lambda: c.mailer,
        mailer_target=redact_url(s.mailer),
        transport=c.mailer_for,
        mailboxes=lambda: c.feedback_sources,
        no_mailbox="SENDQUEUE_FEEDBACK_IMAP is not set (bounces and replies are not read)",
        sender_mailbox=partial(open_sender_mailbox, c),
        public_url=public,
        public_url_target=f"{s.public_url}{HEALTH_PATH}" if s.public_url else "",
    )
    return SetupCheck(parts, secrets=_secrets(s))
