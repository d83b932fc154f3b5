"""A feedback mailbox read over IMAP with imapclient: :class:`ImapFeedbackSource`.

It only reads. The folder is opened read-only (EXAMINE) and bodies are fetched with
``BODY.PEEK[]`` (their first :data:`MAX_MESSAGE_BYTES`), so no flag is set (not even
``\\Seen``), and nothing is moved or deleted: a message that is not feedback stays as the
mailbox's owner left it. Which messages are new is
the caller's cursor (UIDVALIDITY and the highest UID processed), not the mailbox's flags.

Memory: :meth:`ImapFeedbackSource.fetch` reads the UIDs and their ``RFC822.SIZE`` at once,
and the bodies as its iterator goes, in FETCHes of at most :data:`FETCH_BYTES` (the sizes,
each up to :data:`MAX_MESSAGE_BYTES`, added up; at least one message each), handing each
message over and letting it go, so a poll holds a FETCH's worth and the message being read,
never the whole batch (docs/performance.md, benchmark 11).

Sign-in: LOGIN with the URL's user and password, or, for a sender with ``oauth``
(:meth:`ImapFeedbackSource.for_sender`), ``AUTHENTICATE XOAUTH2`` with its access token; a
refused token is renewed once and tried again.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from imapclient import IMAPClient
from imapclient.exceptions import IMAPClientError, LoginError

from sendqueue.adapters.imap.url import (
    MAX_SENDER_TIMEOUT,
    ImapUrl,
    check_imap_url,
    parse_imap_url,
)
from sendqueue.domain.errors import FeedbackUnavailable, InvalidField, OAuthTokenError
from sendqueue.domain.senders import Sender
from sendqueue.domain.transports import TransportRules
from sendqueue.domain.wording import plural
from sendqueue.ports import AccessToken, AccessTokens, FeedbackMessage

__all__ = ["ImapFeedbackSource"]

log = logging.getLogger(__name__)

#: The most UIDs one FETCH of bodies names.
FETCH_CHUNK = 100
#: The most of one message read (its first bytes): headers and report parts come first, and a
#: reply's attachments of tens of megabytes must not make a batch hold gigabytes.
MAX_MESSAGE_BYTES = 1_048_576
#: The most body bytes one FETCH asks for (each message's RFC822.SIZE up to
#: MAX_MESSAGE_BYTES, added up); a FETCH names at least one message, whatever its size.
FETCH_BYTES = 4 * MAX_MESSAGE_BYTES
#: The most UIDs one FETCH of sizes names (the answer is a few bytes per message).
SIZE_CHUNK = 1000
_PARTIAL = f"BODY.PEEK[]<0.{MAX_MESSAGE_BYTES}>"
_SIZE = "RFC822.SIZE"
_ENDED = "another fetch or close() came first"


class ImapFeedbackSource:
    """A :class:`~sendqueue.ports.FeedbackSource` over IMAP.

    One connection, opened at the first :meth:`fetch` and kept for the next ones (the batches of
    one poll); :meth:`close` logs out, and a connection that failed is dropped, so the next
    fetch opens a new one. ``name`` (``imap://user@host:port/folder``) never holds the password,
    nor does ``repr``. Thread-safe: one IMAP command at a time. The lock is held for a command
    only, never while the caller holds a message of the iterator: between two FETCHes the
    connection is idle, so an iterator dropped half-way leaves no answer unread, and
    :meth:`close` never waits for the caller's work on a message.
    """

    def __init__(
        self,
        url: ImapUrl,
        *,
        ssl_context: ssl.SSLContext | None = None,
        oauth: AccessToken | None = None,
    ) -> None:
        if oauth is not None and not url.username:
            url = replace(url, username=oauth.user)
        self._url = url
        self.name = url.name
        self._ssl_context = ssl_context
        self._oauth = oauth
        self._client: IMAPClient | None = None
        self._lock = threading.Lock()
        #: One more at every fetch and close: the iterators of older fetches end.
        self._generation = 0

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        field: str = "feedback_imap",
        ssl_context: ssl.SSLContext | None = None,
        oauth: AccessToken | None = None,
        rules: TransportRules | None = None,
    ) -> ImapFeedbackSource:
        """The source an ``imap://`` or ``imaps://`` URL names (see
        :func:`~sendqueue.adapters.imap.url.parse_imap_url`); with ``oauth`` it signs in with
        XOAUTH2 as the URL's user (none: ``oauth.user``) and needs no password. With ``rules``
        (a sender's own mailbox), a URL they refuse, or whose timeout is over
        :data:`~sendqueue.adapters.imap.url.MAX_SENDER_TIMEOUT`, is an InvalidField naming
        ``field`` and nothing opens."""
        signed = oauth is not None
        if rules is None:
            parsed = parse_imap_url(url, field=field, oauth=signed)
        else:
            limit = MAX_SENDER_TIMEOUT
            parsed = check_imap_url(url, rules, field=field, oauth=signed, max_timeout=limit)
        return cls(parsed, ssl_context=ssl_context, oauth=oauth)

    @classmethod
    def for_sender(
        cls,
        sender: Sender,
        tokens: AccessTokens,
        *,
        rules: TransportRules | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> ImapFeedbackSource:
        """The source of a sender's own mailbox (its ``imap`` URL, under ``rules``; errors
        name ``imap``), signed in with XOAUTH2 when the sender has ``oauth``, with the URL's
        password else. ValueError for a sender without a mailbox."""
        if sender.imap is None:
            raise ValueError(f"sender {sender.email} has no mailbox (imap)")
        oauth = tokens.for_sender(sender) if sender.oauth is not None else None
        return cls.from_url(
            sender.imap, field="imap", ssl_context=ssl_context, oauth=oauth, rules=rules
        )

    def __repr__(self) -> str:
        return f"ImapFeedbackSource({self.name}, security={self._url.security})"

    # -- FeedbackSource -----------------------------------------------------------------------

    def fetch(
        self, after: tuple[int, int] | None, *, limit: int = 500
    ) -> tuple[int, Iterator[FeedbackMessage]]:
        """The folder's UIDVALIDITY and an iterator over at most ``limit`` messages with a UID
        above ``after``'s (all when ``after`` is None or of another UIDVALIDITY), in UID order.
        The UIDs and their sizes are read here, the bodies as the iterator goes (see the
        module docstring); the iterator ends at the next fetch or close."""
        if limit < 1:
            raise InvalidField("limit", limit, "at least 1")
        with self._lock:
            self._generation += 1
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
                step = "sizing"
                chunks = self._chunks(client, uids[:limit])
            except (IMAPClientError, OSError, KeyError, ValueError) as exc:
                self._drop()
                raise self._unavailable(step, exc) from exc
            generation = self._generation
        return uidvalidity, self._bodies(generation, uidvalidity, chunks)

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
        return f"{self.name}: signed in, {plural(count, 'message')} in {self._url.folder}"

    def close(self) -> None:
        """Log out and close the connection, if one is open; the open iterator ends."""
        with self._lock:
            self._generation += 1
            client, self._client = self._client, None
        if client is not None:
            try:
                client.logout()
            except (IMAPClientError, OSError):
                self._shutdown(client)

    # -- internals ----------------------------------------------------------------------------

    @staticmethod
    def _chunks(client: IMAPClient, uids: list[int]) -> list[list[int]]:
        """``uids`` (less those expunged since the SEARCH) in the groups of one FETCH of
        bodies each: at most FETCH_CHUNK UIDs and FETCH_BYTES, at least one message."""
        chunks: list[list[int]] = []
        chunk: list[int] = []
        held = 0
        for start in range(0, len(uids), SIZE_CHUNK):
            part = uids[start : start + SIZE_CHUNK]
            sizes: dict[int, dict[bytes, Any]] = client.fetch(part, [_SIZE])
            for uid in part:
                data = sizes.get(uid)
                if data is None:  # expunged between SEARCH and FETCH: nothing to read
                    continue
                size = min(int(data[_SIZE.encode()]), MAX_MESSAGE_BYTES)
                if chunk and (held + size > FETCH_BYTES or len(chunk) >= FETCH_CHUNK):
                    chunks.append(chunk)
                    chunk, held = [], 0
                chunk.append(uid)
                held += size
        if chunk:
            chunks.append(chunk)
        return chunks

    def _bodies(
        self, generation: int, uidvalidity: int, chunks: list[list[int]]
    ) -> Iterator[FeedbackMessage]:
        """The messages of ``chunks``, one FETCH per chunk, each message handed over and let go
        before the next FETCH; the lock is held for the FETCH only."""
        for uids in chunks:
            with self._lock:
                client = self._client
                if generation != self._generation or client is None:
                    raise FeedbackUnavailable(f"{self.name}: fetching failed: {_ENDED}")
                try:
                    fetched: dict[int, dict[bytes, Any]] = client.fetch(uids, [_PARTIAL])
                    ready = deque(self._read(fetched, uidvalidity, uids))
                except (IMAPClientError, OSError, KeyError, ValueError) as exc:
                    self._drop()
                    raise self._unavailable("fetching", exc) from exc
                del fetched  # the FETCH's answer: only the messages not yet handed over stay
            while ready:
                if generation != self._generation:
                    raise FeedbackUnavailable(f"{self.name}: fetching failed: {_ENDED}")
                yield ready.popleft()

    def _read(
        self, fetched: dict[int, dict[bytes, Any]], uidvalidity: int, uids: list[int]
    ) -> Iterator[FeedbackMessage]:
        for uid in uids:
            data = fetched.get(uid)
            if data is None:  # expunged since the sizes were read: nothing to read
                continue
            raw = data.get(b"BODY[]<0>")
            if not isinstance(raw, bytes):
                raise ValueError(f"no body for UID {uid}")
            yield FeedbackMessage(self.name, uidvalidity, uid, raw)

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
            if self._oauth is not None:
                self._xoauth2(client, self._oauth)
            else:
                client.login(url.username, url.password)
        except BaseException:
            self._shutdown(client)
            raise
        return client

    def _xoauth2(self, client: IMAPClient, oauth: AccessToken) -> None:
        """AUTHENTICATE XOAUTH2; once more with a new token when the server refuses it."""
        token = self._token(oauth)
        try:
            client.oauth2_login(self._url.username, token)
        except LoginError:
            client.oauth2_login(self._url.username, self._token(oauth, rejected=token))

    def _token(self, oauth: AccessToken, rejected: str | None = None) -> str:
        try:
            return oauth.get(rejected)
        except OAuthTokenError as exc:
            raise FeedbackUnavailable(f"{self.name}: signing in failed: {exc}") from exc

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
