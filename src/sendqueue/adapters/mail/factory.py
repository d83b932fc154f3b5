"""Building the configured mailer from its URL (``SENDQUEUE_MAILER``)."""

from __future__ import annotations

from sendqueue.adapters.mail.maildir import MaildirMailer
from sendqueue.adapters.mail.smtp import SmtpMailer
from sendqueue.adapters.mail.url import MaildirUrl, SmtpUrl, parse_mailer_url
from sendqueue.ports import Mailer

__all__ = ["mailer_from_url"]


def mailer_from_url(url: str) -> Mailer:
    """The mailer a URL names.

    - ``maildir:DIR`` (``maildir:./outbox``, ``maildir:/var/mail/out``): :class:`MaildirMailer`;
    - ``smtp://user:pass@host:port?security=starttls|tls|none&timeout=30``:
      :meth:`SmtpMailer.from_url`;
    - ``ses:REGION?configuration_set=NAME``: :meth:`SesMailer.from_url` (the ``aws`` extra).

    Anything else raises ``InvalidField("mailer", ...)``
    (:func:`~sendqueue.adapters.mail.url.parse_mailer_url`, which the settings use too).
    """
    parsed = parse_mailer_url(url)  # the settings validated with it: this cannot fail them
    if isinstance(parsed, MaildirUrl):
        return MaildirMailer(parsed.directory)
    if isinstance(parsed, SmtpUrl):
        return SmtpMailer.from_url(url)
    # Imported here: boto3 is the optional 'aws' extra.
    from sendqueue.adapters.mail.ses import SesMailer

    return SesMailer.from_url(url)
