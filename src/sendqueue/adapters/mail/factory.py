"""Building the configured mailer from its URL (``SENDQUEUE_MAILER``), and a sender's own."""

from __future__ import annotations

import logging
import threading

from sendqueue.adapters.mail.maildir import MaildirMailer
from sendqueue.adapters.mail.smtp import SmtpMailer
from sendqueue.adapters.mail.url import MaildirUrl, SmtpUrl, check_mailer_url, parse_mailer_url
from sendqueue.domain.errors import InvalidField, PermanentMailError
from sendqueue.domain.transports import TransportRules
from sendqueue.ports import Mailer, OutgoingMessage

__all__ = ["RefusedTransport", "SenderMailers", "mailer_from_url", "refused_transport"]

log = logging.getLogger(__name__)


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


class RefusedTransport:
    """The mailer of a stored sender transport that the rules refuse (a ``maildir:`` one in
    production, a host outside the allow-list): every send fails permanently, saying why,
    and nothing is written or sent."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def send(self, message: OutgoingMessage) -> str:
        raise PermanentMailError(f"not sent: {self.reason}")

    def probe(self, timeout: float) -> str:
        """``sendqueue check``: the transport fails as its sends would, saying why."""
        raise PermanentMailError(f"refused: {self.reason}")

    def close(self) -> None:
        """Nothing to close: nothing was opened."""

    def __repr__(self) -> str:
        return f"RefusedTransport({self.reason!r})"


def refused_transport(
    url: str, rules: TransportRules, *, oauth: bool = False
) -> RefusedTransport | None:
    """A :class:`RefusedTransport` for a sender's transport that ``rules`` refuse (a sender may
    have been stored before the rules changed), None for one they allow; ``oauth``: the sender
    signs in with an access token (see :func:`check_mailer_url`)."""
    try:
        check_mailer_url(url, rules, field="transport", oauth=oauth)
    except InvalidField as exc:
        return RefusedTransport(f"the sender's transport {exc.value}: {exc.reason}")
    return None


class SenderMailers:
    """The mailers of the senders' own transports, one per URL, opened on first use under
    ``rules`` (a refused one fails every send) and closed together. With ``shared`` (a test
    container's mailer), every allowed sender's mail goes through that one."""

    def __init__(self, rules: TransportRules, shared: Mailer | None = None) -> None:
        self._rules = rules
        self._shared = shared
        self._lock = threading.Lock()
        self._mailers: dict[str, Mailer] = {}

    def get(self, url: str) -> Mailer:
        with self._lock:
            mailer = self._mailers.get(url)
            if mailer is None:
                refused = refused_transport(url, self._rules)
                if refused is None and self._shared is not None:
                    return self._shared
                mailer = self._mailers[url] = refused or mailer_from_url(url)
        return mailer

    def close(self) -> None:
        with self._lock:
            mailers, self._mailers = list(self._mailers.values()), {}
        for mailer in mailers:
            try:
                mailer.close()
            except Exception:  # closing must not mask the error that got us here
                log.exception("closing a sender's mailer failed")
