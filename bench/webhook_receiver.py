"""The local webhook receivers of benchmark 15, each in its own process, and their ceiling.

``python -m bench.webhook_receiver serve KIND PORT LOG SECRET``: a receiver on 127.0.0.1:PORT
that answers every POST 204 on a kept-alive HTTP/1.1 connection, checks its Standard Webhooks
signature (HMAC-SHA256 of ``"{webhook-id}.{webhook-timestamp}.{body}"`` with the secret's
key, written here from the spec, not imported from sendqueue) and its timestamp (within 5
minutes) and that its body is the one event the ``webhook-id`` names, and appends
``webhook-id arrival-time valid(1/0)`` to LOG, one line per request.

- ``lean``: an asyncio protocol on uvloop's event loop (asyncio's when uvloop is missing) that
  parses the request line, headers and body itself: what every scenario delivers to. Ordered
  delivery waits for each answer, so a receiver's time per request adds to every event's.
- ``threading``: ``http.server.ThreadingHTTPServer``, as a receiver is commonly written in
  Python; kept for its ceiling beside the lean one.

:func:`ceiling` measures a receiver alone: this process sends pre-signed requests one after
another on one kept-alive connection (each waits for its answer, as ordered delivery does),
through a raw socket whose own cost is a few microseconds a request.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import http.server
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple

from bench.common import ROOT, free_port
from bench.fleetproc import process_cpu_seconds

__all__ = ["KINDS", "Arrival", "Listening", "arrivals", "ceiling", "receiver"]

KINDS = ("lean", "threading")
#: Standard Webhooks' tolerance for the webhook-timestamp.
TOLERANCE = 300
_ANSWER = b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n"


class _Checker:
    """Checks one delivery's signature and timestamp, and logs its arrival."""

    def __init__(self, secret: str, out: IO[str]) -> None:
        self.key = base64.b64decode(secret.removeprefix("whsec_"))
        self.out = out

    def arrived(self, msg_id: str, stamp: str, signatures: str, body: bytes) -> None:
        now = time.time()
        content = f"{msg_id}.{stamp}.".encode() + body
        digest = hmac.new(self.key, content, hashlib.sha256).digest()
        expected = "v1," + base64.b64encode(digest).decode()
        signed = any(hmac.compare_digest(expected, s) for s in signatures.split())
        fresh = stamp.isdigit() and abs(now - int(stamp)) <= TOLERANCE
        # one event per request: the body is the event the webhook-id names
        own = body.startswith(b'{"type":') and f'"id":"{msg_id}"'.encode() in body
        self.out.write(f"{msg_id} {now:.6f} {int(signed and fresh and own)}\n")


class _Lean(asyncio.Protocol):
    """HTTP/1.1 requests with a content-length body, answered 204 in order."""

    def __init__(self, checker: _Checker) -> None:
        self.checker = checker
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        answers = 0
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            headers: dict[str, str] = {}
            for line in self.buffer[:end].decode("latin-1").split("\r\n")[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            size = int(headers.get("content-length", "0"))
            if len(self.buffer) < end + 4 + size:
                break
            body = self.buffer[end + 4 : end + 4 + size]
            self.buffer = self.buffer[end + 4 + size :]
            self.checker.arrived(
                headers.get("webhook-id", "-"),
                headers.get("webhook-timestamp", ""),
                headers.get("webhook-signature", ""),
                body,
            )
            answers += 1
        if answers and self.transport is not None:
            self.transport.write(_ANSWER * answers)


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop when installed (the bench extra brings it), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _serve_lean(port: int, checker: _Checker) -> None:
    loop = _new_loop()
    server = loop.run_until_complete(
        loop.create_server(lambda: _Lean(checker), "127.0.0.1", port, backlog=128)
    )
    stopped = asyncio.Event()
    # SIGTERM ends the loop between two callbacks, so no line is left half written
    loop.add_signal_handler(signal.SIGTERM, stopped.set)
    print("ready", flush=True)
    loop.run_until_complete(stopped.wait())
    server.close()


def _serve_threading(port: int, checker: _Checker) -> None:
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real receivers answer

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            with lock:
                checker.arrived(
                    self.headers.get("webhook-id", "-"),
                    self.headers.get("webhook-timestamp", ""),
                    self.headers.get("webhook-signature", ""),
                    body,
                )
            self.send_response(204)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print("ready", flush=True)
    server.serve_forever()


def serve(kind: str, port: int, log: str, secret: str) -> None:
    if kind != "lean":  # the threading server leaves on SIGTERM through the ``with`` below
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with open(log, "a", encoding="utf-8", buffering=1 << 16) as out:
        checker = _Checker(secret, out)
        try:
            (_serve_lean if kind == "lean" else _serve_threading)(port, checker)
        finally:
            out.flush()


class Listening(NamedTuple):
    """A receiver process: its port, its log, and its CPU seconds so far (a callable)."""

    port: int
    log: Path
    cpu_seconds: Callable[[], float | None]


@contextlib.contextmanager
def receiver(home: Path, secret: str, kind: str = "lean") -> Iterator[Listening]:
    """A receiver process of ``kind`` on a free port. Its log is complete (flushed) once the
    block has left."""
    port, log = free_port(), home / f"arrivals-{kind}.log"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.webhook_receiver", "serve", kind, str(port), str(log),
         secret],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {kind} webhook receiver did not start")
        yield Listening(port, log, lambda: process_cpu_seconds(proc.pid))
    finally:
        proc.terminate()  # SIGTERM: the log's buffer is flushed on the way out
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


class Arrival:
    """One event as the receiver saw it: the first arrival's time, how many times it came, and
    whether every one of them was validly signed."""

    __slots__ = ("at", "count", "signed")

    def __init__(self, at: float, signed: bool) -> None:
        self.at, self.count, self.signed = at, 1, signed


def arrivals(log: Path) -> tuple[dict[str, Arrival], list[str]]:
    """Every event of a receiver's log by id, and the ids in the order they first came."""
    seen: dict[str, Arrival] = {}
    order: list[str] = []
    with contextlib.suppress(FileNotFoundError), log.open(encoding="utf-8") as lines:
        for line in lines:
            ident, at, ok = line.split()
            got = seen.get(ident)
            if got is None:
                seen[ident] = Arrival(float(at), ok == "1")
                order.append(ident)
            else:
                got.count += 1
                got.signed = got.signed and ok == "1"
    return seen, order


def _requests(secret: str, count: int) -> list[bytes]:
    """``count`` signed POSTs of an event body like sendqueue's, ready to send."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    stamp = str(int(time.time()))
    out = []
    for n in range(count):
        msg_id = f"evt_{n + 1}"
        body = (
            f'{{"type":"email.cancelled","id":"{msg_id}","timestamp":"2026-12-04T10:15:02.381Z",'
            f'"data":{{"campaign_id":"cdrain0000000","task_id":"cdrain0000000-{n}","step":1,'
            f'"sender":null,"recipient":"r{n}@example.com","state":"Cancelled","outcome":null,'
            '"reason":null,"message_id":null}}'
        ).encode()
        digest = hmac.new(key, f"{msg_id}.{stamp}.".encode() + body, hashlib.sha256).digest()
        head = (
            f"POST /hook HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"webhook-id: {msg_id}\r\nwebhook-timestamp: {stamp}\r\n"
            f"webhook-signature: v1,{base64.b64encode(digest).decode()}\r\n"
            f"user-agent: sendqueue\r\ncontent-length: {len(body)}\r\n\r\n"
        )
        out.append(head.encode() + body)
    return out


def _one_at_a_time(port: int, requests: list[bytes]) -> float:
    """Seconds to send ``requests`` one after another on one connection, each answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started = time.perf_counter()
        for request in requests:
            sock.sendall(request)
            answer = b""
            while not answer.endswith(b"\r\n\r\n"):
                chunk = sock.recv(4096)
                if not chunk:
                    raise RuntimeError("the receiver closed the connection")
                answer += chunk
        return time.perf_counter() - started


def ceiling(home: Path, kind: str, count: int) -> dict[str, Any]:
    """Requests per second the ``kind`` receiver answers alone, one at a time on one
    connection; and whether it logged each one as validly signed."""
    secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    requests = _requests(secret, count)
    with receiver(home, secret, kind) as (port, log, _):
        seconds = _one_at_a_time(port, requests)
    seen, _ = arrivals(log)
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    return {
        "server": f"asyncio protocol on {loop}'s loop" if kind == "lean" else "ThreadingHTTPServer",
        "requests": count,
        "per_second": count / seconds,
        "logged_signed": sum(1 for a in seen.values() if a.signed),
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
