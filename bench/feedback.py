"""Benchmarks 11 and 12: the feedback poll's memory, and the API while a hostile poll runs.

11, :func:`run_memory`: ``messages`` messages of ``size`` bytes are delivered into a real
Dovecot's Maildir, then one ``poll()`` runs in a child process (``python -m bench.feedback
memory URL``) with the parser production uses (the isolated one, parsing in its own process).
The figure is the growth of the child's peak RSS (VmHWM, reset through /proc/self/clear_refs
just before the poll) above its RSS before the poll. Anchor, in the same run: the same poll with
each batch held as a list (``--hold-batch``), as the poller did before. Target: <= 64 MB for
200 messages of 1 MiB.

12, :func:`run_api`: a ``sendqueue serve``-like process (``python -m bench.feedback serve``:
``create_app(start_worker=True)`` under uvicorn, the embedded worker polling a Dovecot mailbox
every second) over a SQLite store with campaigns. This process times ``GET /api/campaigns``,
one request after another (20 ms apart): first while the mailbox is empty ("before"), then
from the moment ``hostile`` messages (``hostile_size`` bytes of ``From:`` lines, ~34,000 in
1 MiB, which the parser of this release takes quadratic time over: ~25 s of CPU each) and a
genuine reply behind them are appended, until that reply is applied (its sender's Pending email
cancelled, seen in the answers' counts) or ``during_seconds`` have passed ("during"). Once
with the isolated parser, once with ``parse_feedback`` in the server's own process (as
before), in one run. Target: during <= 2x before with the isolated parser.

Without Dovecot, each is skipped with the reason. Run: ``python -m bench.feedback
memory-row|api-row``, or ``python -m bench --only feedback``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.common import ROOT, run_child, summarize

__all__ = ["TARGET_API_RATIO", "TARGET_GROWTH_MB", "run_api", "run_memory"]

TARGET_GROWTH_MB = 64.0
TARGET_API_RATIO = 2.0
MIB = 1024 * 1024
#: Seconds between two timed requests (a UI refreshing, not a load test).
_PAUSE = 0.02
VARIANTS = ("isolated", "in-process")


def _mailservers() -> Any:
    """The Dovecot runner of the tests (tests/support/mailservers.py)."""
    from tests.support import mailservers

    return mailservers


@contextlib.contextmanager
def _dovecot() -> Iterator[Any]:
    """A Dovecot over a fresh Maildir in a temporary directory the mail processes can reach."""
    with tempfile.TemporaryDirectory(prefix="sq-bench-feedback-") as tmp:
        root = Path(tmp)
        root.chmod(0o755)
        with _mailservers().running_dovecot(root) as server:
            yield server


def plain_message(n: int, size: int) -> bytes:
    """A plain message of about ``size`` bytes: headers, then lines of text."""
    head = (
        f"From: writer{n}@example.org\r\nTo: bounces@example.com\r\n"
        f"Subject: a long letter {n}\r\nMessage-ID: <big{n}@example.org>\r\n\r\n"
    ).encode()
    line = (f"{n:06d} " + "x" * 69 + "\r\n").encode()
    return head + line * max(1, (size - len(head)) // len(line) + 1)


def hostile_message(n: int, size: int) -> bytes:
    """About ``size`` bytes of ``From:`` lines (one address each), then a short body."""
    head = f"To: bounces@example.com\r\nSubject: offer {n}\r\nMessage-ID: <h{n}@example.net>\r\n"
    lines = [head.encode()]
    total = len(lines[0])
    i = 0
    while total < size:
        line = f"From: u{i}@h{i % 997}.example.net\r\n".encode()
        lines.append(line)
        total += len(line)
        i += 1
    return b"".join(lines) + b"\r\nhello\r\n"


#: A reply proven as the trust rules ask: its From domain authenticated by a trusted server.
REPLY = (
    b"Authentication-Results: mx.bench.example; dmarc=pass header.from=example.com\r\n"
    b"From: Demo <demo001@example.com>\r\nTo: sendqueue@example.com\r\nSubject: Re: Hello\r\n"
    b"Message-ID: <genuine-reply@example.com>\r\nDate: Tue, 1 Dec 2026 09:00:00 +0000\r\n\r\n"
    b"Thanks, but please take me off your list.\r\n"
)


# -- 11: memory ---------------------------------------------------------------------------------


def _status_mb(field: str, pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise LookupError(field)


class _HoldingBatch:
    """A FeedbackSource that lists each batch before handing it over (the anchor)."""

    def __init__(self, source: Any) -> None:
        self._source = source
        self.name: str = source.name

    def fetch(self, after: tuple[int, int] | None, *, limit: int = 500) -> tuple[int, Any]:
        uidvalidity, messages = self._source.fetch(after, limit=limit)
        return uidvalidity, iter(list(messages))

    def close(self) -> None:
        self._source.close()


def memory_child(url: str, hold_batch: bool) -> dict[str, Any]:
    """One poll of the mailbox ``url`` in this process: its RSS growth (see the docstring)."""
    from sendqueue.adapters.imap import ImapFeedbackSource
    from sendqueue.bootstrap import bootstrap
    from sendqueue.settings import Settings
    from sendqueue.testing.mailer import RecordingMailer
    from sendqueue.testing.store import InMemoryTaskStore

    source: Any = ImapFeedbackSource.from_url(url)
    app = bootstrap(
        Settings(_env_file=None),
        store=InMemoryTaskStore(),
        mailer=RecordingMailer(),
        feedback_sources=[_HoldingBatch(source) if hold_batch else source],
    )
    # what production wires for a poller nobody injected a parser into: the isolated one
    poller = app.feedback_poller
    gc.collect()
    baseline = _status_mb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    started = time.perf_counter()
    try:
        report = poller.poll()
        seconds = time.perf_counter() - started
        peak = _status_mb("VmHWM")
        pid = getattr(poller._parse, "pid", None)
        parser_mb = _status_mb("VmHWM", pid) if pid else None
    finally:
        app.close()
    if report.errors or report.skipped:
        raise AssertionError(f"the poll failed: {report.as_dict()}")
    return {
        "messages": report.messages,
        "baseline_rss_mb": baseline,
        "peak_rss_mb": peak,
        "growth_mb": peak - baseline,
        "poll_s": seconds,
        "parser_process_peak_rss_mb": parser_mb,
    }


def run_memory(*, messages: int = 200, size: int = MIB, repeats: int = 1) -> dict[str, Any]:
    """Benchmark 11 (see the module docstring)."""
    reason = _mailservers().dovecot_missing()
    if reason:
        return {"skipped": reason}
    runs: dict[str, list[dict[str, Any]]] = {"sendqueue": [], "hold-batch": []}
    with _dovecot() as dovecot:
        for n in range(messages):
            dovecot.deliver(plain_message(n, size))
        for _ in range(repeats):
            for name, flags in (("sendqueue", ()), ("hold-batch", ("--hold-batch",))):
                run = run_child("bench.feedback", "memory", dovecot.url, *flags)
                if run["messages"] != messages:
                    raise AssertionError(f"{name}: read {run['messages']} of {messages}")
                runs[name].append(run)
    growth = summarize([r["growth_mb"] for r in runs["sendqueue"]])
    parser = [r["parser_process_peak_rss_mb"] for r in runs["sendqueue"]]
    return {
        "messages": messages,
        "size_bytes": size,
        "repeats": repeats,
        "growth_mb": growth.as_dict(),
        "hold_batch_growth_mb": summarize([r["growth_mb"] for r in runs["hold-batch"]]).as_dict(),
        "poll_s": summarize([r["poll_s"] for r in runs["sendqueue"]]).as_dict(),
        "parser_process_peak_rss_mb": summarize([p for p in parser if p is not None]).as_dict(),
        "targets": [
            {
                "name": f"feedback poll of {messages} x {size // 1024:,} KiB: peak RSS growth",
                "value": growth.median,
                "limit": TARGET_GROWTH_MB,
                "unit": "MB",
                "passed": growth.median <= TARGET_GROWTH_MB,
            }
        ],
    }


# -- 12: the API during a hostile poll -----------------------------------------------------------


def _settings(home: Path, url: str) -> Any:
    from sendqueue.settings import Settings

    return Settings(
        _env_file=None,
        database_url=f"sqlite:///{home / 'store.db'}",
        scheduler_url=f"sqlite:///{home / 'scheduler.db'}",
        mailer=f"maildir:{home / 'outbox'}",
        feedback_imap=url,
        secret_key="bench-feedback-key-0123456789abcdef0123",  # feedback needs the key
        trusted_authserv="mx.bench.example",
        feedback_interval=1,
    )


def serve(home: Path, url: str, parser: str) -> None:
    """The server child: the web app with its embedded worker, polling ``url`` every second."""
    from sendqueue.bootstrap import bootstrap
    from sendqueue.domain.reports import parse_feedback
    from sendqueue.web.app import create_app, run_server

    app = bootstrap(
        _settings(home, url), parse_feedback=parse_feedback if parser == "in-process" else None
    )
    run_server(
        create_app(app, start_worker=True),
        host="127.0.0.1",
        port=0,
        on_started=lambda started: print(started, flush=True),
    )
    app.close()


@contextlib.contextmanager
def _server(home: Path, url: str, parser: str) -> Iterator[str]:
    """The server child over ``home``; its URL. Its log goes to ``home/server.log``."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    log = (home / "server.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.feedback", "serve", str(home), url, parser],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    try:
        assert server.stdout is not None
        started = server.stdout.readline().strip()
        if not started.startswith("http"):
            tail = (home / "server.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the server did not start: {started!r}\n{tail}")
        yield started
    finally:
        server.terminate()  # a parse in this process holds up its shutdown: killed after 10 s
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
        if server.stdout is not None:
            server.stdout.close()
        log.close()


def _timed(
    client: Any, seconds: float, done: Callable[[Any], bool] | None = None
) -> tuple[list[float], float | None]:
    """``GET /api/campaigns`` until ``seconds`` pass (or ``done(answer)``): the milliseconds
    of each, and the time.monotonic() at which ``done`` held."""
    timings: list[float] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        response = client.get("/api/campaigns")
        timings.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise AssertionError(f"GET /api/campaigns: {response.status_code}")
        if done is not None and done(response.json()):
            return timings, time.monotonic()
        time.sleep(_PAUSE)
    return timings, None


def _replied(answer: Any) -> bool:
    """The genuine reply was applied: its sender's Pending email is cancelled."""
    return any(c["counts"].get("Cancelled", 0) for c in answer["campaigns"])


def _append(dovecot: Any, messages: list[bytes]) -> None:
    client = dovecot.client()
    try:
        for raw in messages:
            client.append("INBOX", raw)
    finally:
        client.logout()


def api_once(parser: str, *, hostile: int, hostile_size: int, tasks: int, campaigns: int,
             before_seconds: float, during_seconds: float) -> dict[str, Any]:  # fmt: skip
    """One measurement of benchmark 12 with ``parser`` (``isolated`` or ``in-process``)."""
    import httpx

    from bench.stream import prepare

    with _dovecot() as dovecot, tempfile.TemporaryDirectory(prefix="sq-bench-api-") as tmp:
        home = Path(tmp)
        prepare(home, tasks, campaigns)
        with (
            _server(home, dovecot.url, parser) as url,
            httpx.Client(base_url=url, timeout=120) as client,
        ):
            _timed(client, 2.0)  # the start-up reconciler pass and the first (empty) poll
            before, _ = _timed(client, before_seconds)
            _append(dovecot, [hostile_message(n, hostile_size) for n in range(hostile)] + [REPLY])
            appended = time.monotonic()
            during, applied = _timed(client, during_seconds, _replied)
    return {
        "before_ms": summarize(before).median,
        "during_ms": summarize(during).median,
        "requests": [len(before), len(during)],
        "reply_applied_s": None if applied is None else applied - appended,
    }


def run_api(*, hostile: int = 3, hostile_size: int = MIB, tasks: int = 200, campaigns: int = 5,
            before_seconds: float = 10.0, during_seconds: float = 30.0,
            repeats: int = 1) -> dict[str, Any]:  # fmt: skip
    """Benchmark 12 (see the module docstring): both parsers, alternately."""
    reason = _mailservers().dovecot_missing()
    if reason:
        return {"skipped": reason}
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for n in range(repeats):
        for parser in VARIANTS if n % 2 == 0 else tuple(reversed(VARIANTS)):
            runs[parser].append(
                api_once(
                    parser,
                    hostile=hostile,
                    hostile_size=hostile_size,
                    tasks=tasks,
                    campaigns=campaigns,
                    before_seconds=before_seconds,
                    during_seconds=during_seconds,
                )
            )
    variants: dict[str, Any] = {}
    for parser, measured in runs.items():
        before = summarize([r["before_ms"] for r in measured])
        during = summarize([r["during_ms"] for r in measured])
        variants[parser] = {
            "before_ms": before.as_dict(),
            "during_ms": during.as_dict(),
            "ratio": during.median / before.median,
            "requests": [r["requests"] for r in measured],
            "reply_applied_s": [r["reply_applied_s"] for r in measured],
        }
    ratio = variants["isolated"]["ratio"]
    return {
        "hostile": hostile,
        "hostile_size_bytes": hostile_size,
        "tasks": tasks,
        "campaigns": campaigns,
        "during_seconds": during_seconds,
        "repeats": repeats,
        "variants": variants,
        "targets": [
            {
                "name": "GET /api/campaigns median during a hostile feedback poll <= 2x before",
                "value": ratio,
                "limit": TARGET_API_RATIO,
                "unit": "x",
                "passed": ratio <= TARGET_API_RATIO,
            }
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.feedback")
    parser.add_argument("side", choices=["memory", "serve", "memory-row", "api-row"])
    parser.add_argument("rest", nargs="*")
    parser.add_argument("--hold-batch", action="store_true")
    args = parser.parse_args()
    if args.side == "memory":
        print(json.dumps(memory_child(args.rest[0], args.hold_batch)))
    elif args.side == "serve":
        home, url, which = args.rest
        serve(Path(home), url, which)
    elif args.side == "memory-row":
        print(json.dumps(run_memory(), indent=2))
    else:
        print(json.dumps(run_api(), indent=2))


if __name__ == "__main__":
    main()
