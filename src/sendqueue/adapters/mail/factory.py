"""Building the configured mailer from its URL (``SENDQUEUE_MAILER``), and each sender's
(:class:`SenderMailers`, under the transport rules)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sendqueue.adapters.mail.maildir import MaildirMailer
from sendqueue.adapters.mail.smtp import SmtpMailer
from sendqueue.adapters.mail.url import MaildirUrl, SmtpUrl, check_mailer_url, parse_mailer_url
from sendqueue.domain.errors import InvalidField, PermanentMailError
from sendqueue.domain.senders import Sender
from sendqueue.domain.transports import TransportRules
from sendqueue.ports import AccessTokens, Mailer, OutgoingMessage

__all__ = [
    "RefusedTransport",
    "SenderMailers",
    "check_sender_transport",
    "mailer_from_url",
    "refused_transport",
]

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


def check_sender_transport(
    url: str | None, rules: TransportRules, configured: str, *, oauth: bool = False
) -> None:
    """A sender's transport under ``rules`` (InvalidField naming ``transport``). A sender with
    ``oauth`` and no transport signs in to the ``configured`` mailer (SENDQUEUE_MAILER) with
    its access token: when that is SMTP in plain text to another machine (a relay that takes
    mail without a password), InvalidField naming ``oauth``. Only that rule applies to it (the
    allow-list is not SENDQUEUE_MAILER's)."""
    if url is not None:
        check_mailer_url(url, rules, field="transport", oauth=oauth)
        return
    if not oauth or not configured.startswith("smtp:"):
        return
    try:
        check_mailer_url(configured, TransportRules(), oauth=True)
    except InvalidField as exc:
        raise InvalidField(
            "oauth",
            f"the configured mailer {exc.value} (SENDQUEUE_MAILER)",
            f"signing in to it with the sender's access token: {exc.reason}; give the sender "
            "a transport of its own",
        ) from None


class SenderMailers:
    """Each sender's mailer, opened at its first send and closed with :meth:`close`.

    A sender's own transport is checked against ``rules`` first: one they refuse gets a
    :class:`RefusedTransport`, which fails every send. With ``shared`` (a test container's
    mailer), every other sender's mail goes through that one. Otherwise a sender without
    ``oauth`` sends through its own transport (one mailer per URL, shared by the senders
    naming it) or, without one, through ``default``. A sender with ``oauth`` whose transport
    (its own, or else ``default_url``) is SMTP gets a mailer of its own that signs in with
    XOAUTH2 as the URL's user or the sender's address, with the token ``tokens`` hands out;
    over SES or a Maildir, which have no sign-in of the sender's, the grant is not used.
    """

    def __init__(
        self,
        default: Callable[[], Mailer],
        default_url: str,
        tokens: AccessTokens,
        rules: TransportRules,
        shared: Mailer | None = None,
    ) -> None:
        self._default = default
        self._default_url = default_url
        self._tokens = tokens
        self._rules = rules
        self._shared = shared
        self._lock = threading.Lock()
        self._mailers: dict[tuple[str, ...], Mailer] = {}
        self._refused: dict[tuple[str, bool], RefusedTransport | None] = {}

    def for_sender(self, sender: Sender) -> Mailer:
        """The mailer ``sender`` (as the store has it now) sends through."""
        url = sender.transport or self._default_url
        if sender.transport is not None:
            refused = self._check(sender.transport, oauth=sender.oauth is not None)
            if refused is not None:
                return refused
        if self._shared is not None:
            return self._shared
        if sender.oauth is not None and url.startswith("smtp:"):
            if sender.transport is None and (refused := self._configured_refused()) is not None:
                return refused
            # Every call: a grant changed in the store replaces the one in use.
            token = self._tokens.for_sender(sender)
            key = ("oauth", sender.id, sender.email, url)
            return self._get(key, lambda: SmtpMailer.from_url(url, oauth=token))
        if sender.transport is None:
            return self._default()
        return self._get((url,), lambda: mailer_from_url(url))

    def _check(self, url: str, *, oauth: bool) -> RefusedTransport | None:
        """The rules' verdict on a transport, worked out once per URL (the rules are fixed)."""
        key = (url, oauth)
        with self._lock:
            if key not in self._refused:
                self._refused[key] = refused_transport(url, self._rules, oauth=oauth)
            return self._refused[key]

    def _configured_refused(self) -> RefusedTransport | None:
        """The configured mailer's verdict for an OAuth sender without a transport
        (:func:`check_sender_transport`)."""
        try:
            check_sender_transport(None, self._rules, self._default_url, oauth=True)
        except InvalidField as exc:
            return RefusedTransport(f"{exc.value}: {exc.reason}")
        return None

    def _get(self, key: tuple[str, ...], build: Callable[[], Mailer]) -> Mailer:
        with self._lock:
            mailer = self._mailers.get(key)
            if mailer is None:
                mailer = self._mailers[key] = build()
        return mailer

    def close(self) -> None:
        """Close every mailer opened here (the default one is not theirs to close)."""
        with self._lock:
            mailers = list(self._mailers.values())
            self._mailers.clear()
        for mailer in mailers:
            try:
                mailer.close()
            except Exception:  # one mailer failing to close must not keep the others open
                log.exception("closing a sender's mailer failed")
