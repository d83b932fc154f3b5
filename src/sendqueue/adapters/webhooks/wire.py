"""HTTP/1.1 on one connected socket, for one webhook delivery at a time.

:func:`request_head` writes a POST's request line and headers (checked for control
characters); :class:`Wire` sends head and body in one ``sendall`` and reads the answer: the
status line (1xx interim answers skipped), at most :data:`MAX_HEADERS` header lines of at most
:data:`MAX_LINE` bytes, and the body framed by ``content-length``, ``chunked`` or the end of
the connection, read to at most :data:`MAX_BODY` bytes and dropped. Everything happens before
the delivery's one deadline, every read and interim answer included: a receiver dripping its
status line or headers, or repeating ``100 Continue``, times out at it. Once the final status
and headers have come, a body still arriving at the deadline is not waited for (the answer
counts; the connection is not reused).

Not http.client, because delivery is one event at a time per endpoint (its order): every event
waits for its own round trip, and http.client sent each request in two writes (the receiver
woke twice per event) and parsed every answer's headers through the email package. The
figures are in docs/performance.md (benchmark 15).
"""

from __future__ import annotations

import re
import select
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "MAX_BODY",
    "MAX_HEADERS",
    "MAX_LINE",
    "Answer",
    "BadStatusLine",
    "Disconnected",
    "ProtocolError",
    "Wire",
    "request_head",
    "request_line",
    "time_left",
]

#: The most of a response body read (then dropped).
MAX_BODY = 64 * 1024
#: The longest status or header line, and the most header lines, of an answer (http.client's).
MAX_LINE = 65536
MAX_HEADERS = 100

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_DIGITS = re.compile(r"[0-9]{1,18}")
_OURS = frozenset({"host", "content-length", "accept-encoding", "transfer-encoding"})
# Header names already checked (a delivery's are the same few every time).
_NAMES: set[str] = set()


class Disconnected(Exception):
    """The connection ended before any byte of an answer (a kept-alive one the server closed)."""


class ProtocolError(Exception):
    """The answer is not HTTP/1.x as this client reads it; the message says how (never quoting
    the receiver's bytes)."""


class BadStatusLine(ProtocolError):
    """The first line of the answer is not an HTTP/1.x status line: not HTTP at all."""


@dataclass(frozen=True)
class Answer:
    """A final answer: its status, and whether the connection can carry the next request (the
    body ended within the limit, nothing followed it, and the server keeps it open)."""

    status: int
    reusable: bool


def request_line(target: str, host: str) -> str:
    """A POST's request line and the headers every request to ``host`` carries (``target``
    and ``host`` as checked from the URL): the start of :func:`request_head`."""
    return f"POST {target} HTTP/1.1\r\nHost: {host}\r\nAccept-Encoding: identity\r\n"


def request_head(line: str, headers: Mapping[str, str], length: int) -> bytes:
    """The head of a POST of ``length`` bytes: ``line`` (:func:`request_line`), the headers
    and the blank line. A header name that is not a token, or a value holding a control
    character, is ProtocolError (nothing is sent); ``Host`` and the body's framing are this
    module's own."""
    parts = [line, f"Content-Length: {length}\r\n"]
    for name, value in headers.items():
        if name not in _NAMES:
            if not _TOKEN.fullmatch(name):
                raise ProtocolError(f"header {name[:40]!r} is not a valid HTTP header")
            if name.lower() in _OURS:
                continue
            if len(_NAMES) < 1000:
                _NAMES.add(name)
        parts.append(f"{name}: {value}\r\n")
    if _CONTROL.search("".join(headers.values())):
        raise ProtocolError("a header value holds a control character")
    parts.append("\r\n")
    try:
        return "".join(parts).encode("latin-1")
    except UnicodeEncodeError:
        raise ProtocolError("a header holds a character HTTP cannot carry") from None


class Wire:
    """One connected socket (plain or TLS) and the bytes read past the last line."""

    __slots__ = ("_buffer", "answered", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""
        self.answered = False
        """Whether any byte of the last exchange's answer came (a reset after one is not a
        stale connection: the request may have been handled)."""

    def quiet(self) -> bool:
        """Whether an idle connection has nothing waiting: bytes (a late second answer) or its
        end would be read as the next request's answer, so such a connection is not reused."""
        if self._buffer:
            return False
        pending = getattr(self.sock, "pending", None)
        if pending is not None and pending():
            return False
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def exchange(self, request: bytes, deadline: float) -> Answer:
        """Send ``request`` (head and body) and read the final answer. Raises Disconnected,
        ProtocolError, TimeoutError and the socket's OSError (ssl.SSLError included)."""
        self.answered = False
        self.sock.settimeout(time_left(deadline))
        self.sock.sendall(request)
        while True:
            status, version = self._status(deadline)
            fields = self._headers(deadline)
            if not (100 <= status < 200) or status == 101:
                break
        close = _closes(version, fields)
        try:
            ended, close = self._body(status, fields, close, deadline)
        except TimeoutError:
            ended = False  # the status has come: the rest of the body is not waited for
        return Answer(status, ended and not close and not self._buffer)

    def close(self) -> None:
        self.sock.close()

    # -- reading -----------------------------------------------------------------------------

    def _body(
        self, status: int, fields: Mapping[str, str], close: bool, deadline: float
    ) -> tuple[bool, bool]:
        """Read the final answer's body; (whether it ended, whether the server closes)."""
        if 100 <= status < 200 or status in (204, 304):
            return True, close
        encoding = fields.get("transfer-encoding")
        if encoding is not None and "content-length" in fields:
            raise ProtocolError("both Transfer-Encoding and Content-Length")
        if encoding is not None:
            chunked = encoding.rsplit(",", 1)[-1].strip().lower() == "chunked"
            ended = self._chunked(deadline) if chunked else self._to_end(deadline)
            return ended, close or not chunked
        length = _length(fields.get("content-length"))
        if length is not None:
            return self._exactly(length, deadline), close
        return self._to_end(deadline), True

    def _fill(self, deadline: float) -> bool:
        """Read more into the buffer; False at the end of the connection."""
        self.sock.settimeout(time_left(deadline))
        chunk = self.sock.recv(65536)
        if not chunk:
            return False
        self.answered = True
        self._buffer += chunk
        return True

    def _line(self, deadline: float) -> bytes | None:
        """The next line without its line end; None when the connection ended first."""
        while True:
            end = self._buffer.find(b"\n", 0, MAX_LINE + 1)
            if end >= 0:
                line, self._buffer = self._buffer[:end], self._buffer[end + 1 :]
                return line.removesuffix(b"\r")
            if len(self._buffer) > MAX_LINE:
                raise ProtocolError("an answer line is too long")
            if not self._fill(deadline):
                return None

    def _status(self, deadline: float) -> tuple[int, str]:
        started = not self._buffer
        line = self._line(deadline)
        if line is None:
            if started:
                raise Disconnected
            raise ProtocolError("the connection ended within the status line")
        parts = line.decode("latin-1").split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise BadStatusLine("not an HTTP/1.x status line")
        code = parts[1]
        if len(code) != 3 or not (code.isascii() and code.isdigit()) or int(code) < 100:
            raise BadStatusLine("not an HTTP status code")
        return int(code), parts[0]

    def _headers(self, deadline: float) -> dict[str, str]:
        """The header fields this client needs (lower-case names; repeated ones joined by
        commas), after reading every line up to the blank one."""
        fields: dict[str, str] = {}
        for _ in range(MAX_HEADERS + 1):
            line = self._line(deadline)
            if line is None:
                raise ProtocolError("the connection ended within the headers")
            if not line:
                return fields
            if line[:1] in (b" ", b"\t"):
                continue  # an obsolete folded line: no field this client reads is folded
            name, _, value = line.decode("latin-1").partition(":")
            key = name.strip().lower()
            if key in ("content-length", "transfer-encoding", "connection", "keep-alive"):
                value = value.strip()
                fields[key] = f"{fields[key]},{value}" if key in fields else value
        raise ProtocolError(f"more than {MAX_HEADERS} header lines")

    def _exactly(self, length: int, deadline: float) -> bool:
        """Read ``length`` bytes of body; False past MAX_BODY or at an early end."""
        if length > MAX_BODY:
            self._to_end(deadline, MAX_BODY)
            return False
        while len(self._buffer) < length:
            if not self._fill(deadline):
                return False
        self._buffer = self._buffer[length:]
        return True

    def _chunked(self, deadline: float) -> bool:
        """Read a chunked body and its trailers; False past MAX_BODY or at an early end."""
        budget = MAX_BODY
        while True:
            line = self._line(deadline)
            if line is None:
                return False
            size_text = line.split(b";", 1)[0].strip()
            if not _HEX.fullmatch(size_text):  # int() would take "0x5", "0_0" or "+5"
                raise ProtocolError("a bad chunk size")
            size = int(size_text, 16)
            if size == 0:
                for _ in range(MAX_HEADERS + 1):
                    trailer = self._line(deadline)
                    if trailer is None:
                        return False
                    if not trailer:
                        return True
                raise ProtocolError(f"more than {MAX_HEADERS} trailer lines")
            if size > budget or not self._exactly(size, deadline):
                return False
            budget -= size
            if self._line(deadline) != b"":
                raise ProtocolError("a chunk without its line end")

    def _to_end(self, deadline: float, budget: int = MAX_BODY) -> bool:
        """Read until the connection ends; False if ``budget`` bytes came first."""
        while len(self._buffer) <= budget:
            if not self._fill(deadline):
                self._buffer = b""
                return True
        return False


def time_left(deadline: float) -> float:
    """Seconds left before ``deadline`` (monotonic); TimeoutError when none are."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


def _closes(version: str, fields: Mapping[str, str]) -> bool:
    """Whether the server closes the connection after this answer."""
    tokens = {t.strip().lower() for t in fields.get("connection", "").split(",")}
    if "close" in tokens:
        return True
    if version == "HTTP/1.0":
        return "keep-alive" not in tokens and "keep-alive" not in fields
    return False


def _length(value: str | None) -> int | None:
    """A content-length (every repeat the same), None when absent; ProtocolError when the
    repeats differ or it is not a number of at most 18 ASCII digits (the framing is unknown)."""
    if value is None:
        return None
    values = {v.strip() for v in value.split(",")}
    text = values.pop()
    if values or not _DIGITS.fullmatch(text):
        raise ProtocolError("a bad Content-Length")
    return int(text)
