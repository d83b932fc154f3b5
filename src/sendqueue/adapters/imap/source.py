"""A feedback mailbox read over IMAP with imapclient: :class:`ImapFeedbackSource`.

It only reads. The folder is opened read-only (EXAMINE) and bodies are fetched with
``BODY.PEEK[]`` (their first :data:`MAX_MESSAGE_BYTES`), so no flag is set (not even
``\\Seen``), and nothing is moved or deleted: a message that is not feedback stays as the
mailbox's owner left it. Which messages are new is
the caller's cursor (UIDVALIDITY and the highest UID processed), not the mailbox's flags.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from typing import Any

from imapclient import IMAPClient
from imapclient.exceptions import IMAPClientError

from sendqueue.adapters.imap.url import ImapUrl, parse_imap_url
from sendqueue.domain.errors import FeedbackUnavailable, InvalidField
from sendqueue.ports import FeedbackMessage

__all__ = ["ImapFeedbackSource"]

log = logging.getLogger(__name__)

#: The most UIDs one FETCH names (a batch of ``limit`` goes in chunks of this many).
FETCH_CHUNK = 100
#: The most of one message read (its first bytes): headers and report parts come first, and a
#: reply's attachments of tens of megabytes must not make a batch hold gigabytes.
MAX_MESSAGE_BYTES = 1_048_576
_PARTIAL = f"BODY.PEEK[]<0.{MAX_MESSAGE_BYTES}>"


class ImapFeedbackSource:
    """A :class:`~sendqueue.ports.FeedbackSource` over IMAP.

    One connection, opened at the first :meth:`fetch` and kept for the next ones (the batches of
    one poll); :meth:`close` logs out, and a connection that failed is dropped, so the next
    fetch opens a new one. ``name`` (``imap://user@host:port/folder``) never holds the password,
    nor does ``repr``. Thread-safe (one fetch at a time).
    """

    def __init__(self, url: ImapUrl, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self._url = url
        self.name = url.name
        self._ssl_context = ssl_context
        self._client: IMAPClient | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        field: str = "feedback_imap",
        ssl_context: ssl.SSLContext | None = None,
    ) -> ImapFeedbackSource:
        """The source an ``imap://`` or ``imaps://`` URL names (see
        :func:`~sendqueue.adapters.imap.url.parse_imap_url`)."""
        return cls(parse_imap_url(url, field=field), ssl_context=ssl_context)

    def __repr__(self) -> str:
        return f"ImapFeedbackSource({self.name}, security={self._url.security})"

    # -- FeedbackSource -----------------------------------------------------------------------

    def fetch(
        self, after: tuple[int, int] | None, *, limit: int = 500
    ) -> tuple[int, list[FeedbackMessage]]:
        """The folder's UIDVALIDITY and at most ``limit`` messages with a UID above ``after``'s
        (all when ``after`` is None or of another UIDVALIDITY), in UID order."""
        if limit < 1:
            raise InvalidField("limit", limit, "at least 1")
        with self._lock:
            step = "connecting"
            try:
                client = self._connected()
                step = f"opening {self._url.folder}"
                selected = client.select_folder(self._url.folder, readonly=True)
                uidvalidity = int(selected[b"UIDVALIDITY"])
                first = after[1] + 1 if after is not None and after[0] == uidvalidity else 1
                step = "searching"
                # "first:*" also matches the highest UID when it is below first (RFC 3501
                # 6.4.8: "*" is the largest UID in use), so the range is checked again here.
                uids = sorted(u for u in client.search(["UID", f"{first}:*"]) if u >= first)
                step = "fetching"
                messages = self._bodies(client, uidvalidity, uids[:limit])
            except (IMAPClientError, OSError, KeyError, ValueError) as exc:
                self._drop()
                raise self._unavailable(step, exc) from exc
        return uidvalidity, messages

    def probe(self, timeout: float) -> str:
        """Sign in on a connection of its own, open the folder read-only (EXAMINE) and log out;
        see :class:`~sendqueue.ports.Probe`. Nothing in the mailbox changes."""
        timeout = min(timeout, self._url.timeout)
        step = "signing in"
        try:
            client = self._open(timeout)
        except (IMAPClientError, OSError) as exc:
            raise self._unavailable(step, exc, timeout) from exc
        try:
            step = f"opening {self._url.folder}"
            selected = client.select_folder(self._url.folder, readonly=True)
            count = int(selected.get(b"EXISTS", 0))
        except (IMAPClientError, OSError, ValueError) as exc:
            self._shutdown(client)
            raise self._unavailable(step, exc, timeout) from exc
        try:
            client.logout()
        except (IMAPClientError, OSError):
            self._shutdown(client)
        return f"{self.name}: signed in, {count} message(s) in {self._url.folder}"

    def close(self) -> None:
        """Log out and close the connection, if one is open."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.logout()
            except (IMAPClientError, OSError):
                self._shutdown(client)

    # -- internals ----------------------------------------------------------------------------

    def _bodies(
        self, client: IMAPClient, uidvalidity: int, uids: list[int]
    ) -> list[FeedbackMessage]:
        out: list[FeedbackMessage] = []
        for start in range(0, len(uids), FETCH_CHUNK):
            chunk = uids[start : start + FETCH_CHUNK]
            fetched: dict[int, dict[bytes, Any]] = client.fetch(chunk, [_PARTIAL])
            for uid in chunk:
                data = fetched.get(uid)
                if data is None:  # expunged between SEARCH and FETCH: nothing to read
                    continue
                raw = data.get(b"BODY[]<0>")
                if not isinstance(raw, bytes):
                    raise ValueError(f"no body for UID {uid}")
                out.append(FeedbackMessage(self.name, uidvalidity, uid, raw))
        return out

    def _connected(self) -> IMAPClient:
        if self._client is None:
            self._client = self._open(self._url.timeout)
        return self._client

    def _open(self, timeout: float) -> IMAPClient:
        """A new connection, secured as configured and signed in."""
        url = self._url
        context = self._ssl_context or ssl.create_default_context()
        client = IMAPClient(
            url.host,
            port=url.port,
            ssl=url.security == "tls",
            ssl_context=context if url.security == "tls" else None,
            timeout=timeout,
        )
        try:
            if url.security == "starttls":
                client.starttls(context)
            client.login(url.username, url.password)
        except BaseException:
            self._shutdown(client)
            raise
        return client

    def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            self._shutdown(client)

    @staticmethod
    def _shutdown(client: IMAPClient) -> None:
        try:
            client.shutdown()
        except (IMAPClientError, OSError):
            log.debug("closing an IMAP connection failed", exc_info=True)

    def _unavailable(
        self, step: str, exc: BaseException, timeout: float | None = None
    ) -> FeedbackUnavailable:
        if isinstance(exc, socket.timeout | TimeoutError):
            reason = f"timed out after {self._url.timeout if timeout is None else timeout:g}s"
        else:
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return FeedbackUnavailable(f"{self.name}: {step} failed: {reason}")
