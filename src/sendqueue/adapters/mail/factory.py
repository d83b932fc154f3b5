"""Building the configured mailer from its URL (``SENDQUEUE_MAILER``)."""

from __future__ import annotations

from sendqueue.adapters.mail.maildir import MaildirMailer
from sendqueue.adapters.mail.smtp import SmtpMailer
from sendqueue.domain.errors import InvalidField
from sendqueue.ports import Mailer

__all__ = ["mailer_from_url"]


def mailer_from_url(url: str) -> Mailer:
    """The mailer a URL names.

    - ``maildir:DIR`` (``maildir:./outbox``, ``maildir:/var/mail/out``): :class:`MaildirMailer`;
    - ``smtp://user:pass@host:port?security=starttls|tls|none&timeout=30``:
      :meth:`SmtpMailer.from_url`;
    - ``ses:REGION?configuration_set=NAME``: :meth:`SesMailer.from_url` (the ``aws`` extra).

    Anything else raises ``InvalidField("mailer", ...)``.
    """
    if url.startswith("maildir:"):
        directory = url[len("maildir:") :]
        if not directory:
            raise InvalidField("mailer", url, "maildir: needs a directory, e.g. maildir:./outbox")
        return MaildirMailer(directory)
    if url.startswith("smtp://"):
        return SmtpMailer.from_url(url)
    if url.startswith("ses:"):
        # Imported here: boto3 is the optional 'aws' extra.
        from sendqueue.adapters.mail.ses import SesMailer

        return SesMailer.from_url(url)
    shown = url.split("@", 1)[-1] if "@" in url else url  # never echo a password
    raise InvalidField("mailer", shown, "expected maildir:DIR or smtp://user:pass@host:port")
