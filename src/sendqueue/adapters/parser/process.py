"""The feedback parser in a child process, with a time budget per message.

Why: anyone who can send mail writes the messages the feedback poller parses, and the parser is
pure Python. In the process that also serves the web app (``sendqueue serve`` embeds the worker
and its poller), a message that is slow to parse holds the GIL, and every request waits with
it; and the poll waits for it, holding back the genuine messages behind it. In a child process
the parse holds nothing of the parent's, and the parent waits for it at most the budget.

How: one long-lived child, started at the first message as a fresh interpreter
(``python -c``, then :func:`child_main`), so it holds none of the parent's threads, sockets or
heap; unlike multiprocessing's "spawn" it never imports the parent's ``__main__`` either (a
program embedding sendqueue need not guard its own). It gets the parent's ``sys.path`` and the
parse function (by reference), then reads ``(raw, kwargs)`` from a socket pair, calls the parse
function with them and answers ``("ok", items)`` or ``("error", text)``. The parent sends one
message at a time and waits for the answer at most ``seconds`` (a poll of the socket, which
releases the GIL). Past the budget it kills the child and raises
:class:`~sendqueue.domain.errors.FeedbackParseFailed`; a child that died mid-parse (an answer of
EOF) and a parse that raised are FeedbackParseFailed too. The next message after a kill or a
death starts a new child; a child's start is no part of any budget. A child that cannot start
at all raises :class:`~sendqueue.domain.errors.FeedbackUnavailable`: that is no message's
fault, and none is skipped for it.

The child runs :data:`NICE` steps nicer than its parent: when the machine's cores are busy, the
parent's web requests get the CPU first (docs/performance.md, benchmark 12). The budget is wall
time, so a starved child gets less of it; a genuine message takes milliseconds of CPU.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from sendqueue.domain.errors import FeedbackParseFailed, FeedbackUnavailable, InvalidField
from sendqueue.domain.feedback import Feedback

__all__ = ["IsolatedParser", "child_main"]

log = logging.getLogger(__name__)

#: The most seconds a new child may take to import the parse function and say it is ready.
START_SECONDS = 60.0
#: How much nicer the child is than its parent (``nice(2)``: lower CPU priority).
NICE = 10
#: Seconds a child is given to exit once its socket is closed, before it is killed.
_EXIT_SECONDS = 2.0
_READY = "ready"
_AGAIN = "the next message starts a new one"
#: The child's first statements: the parent's import path (argv[2]) before any import of
#: sendqueue, then :func:`child_main` on the inherited descriptor (argv[1]).
_BOOT = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[2]); "
    "from sendqueue.adapters.parser.process import child_main; child_main(int(sys.argv[1]))"
)


def child_main(fd: int) -> None:
    """The child process: its end of the socket pair is ``fd``; the parse function comes
    first, then the messages."""
    # Ctrl-C in a terminal reaches the whole process group: the parent decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Background work: on a busy machine the web requests of the parent get the CPU first.
    os.nice(NICE)
    conn = Connection(fd)
    try:
        pickled = conn.recv_bytes()
    except EOFError:
        return
    _serve(conn, pickle.loads(pickled))  # imports the parse function's module


def _serve(conn: Connection, parse: Callable[..., Any]) -> None:
    """The child's loop: parse what comes down ``conn`` until the parent closes its end."""
    conn.send(_READY)
    while True:
        try:
            raw, kwargs = conn.recv()
        except EOFError:
            return
        try:
            answer: tuple[str, Any] = ("ok", parse(raw, **kwargs))
        except Exception as exc:
            answer = ("error", f"{type(exc).__name__}: {exc}"[:1000])
        try:
            conn.send(answer)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            conn.send(("error", f"its result could not be sent back: {exc}"[:1000]))


class IsolatedParser:
    """A :class:`~sendqueue.services.feedback.poll.FeedbackParser` that calls ``parse`` in a
    child process and waits for it at most ``seconds`` per message (see the module docstring).

    ``parse`` is taken by reference: an importable top-level function (``parse_feedback``, or
    a test's deliberately slow one), which the child imports. Every keyword argument of a call
    goes to it unchanged. One message at a time (calls from several threads take turns).
    :meth:`close` stops the child; a later call starts another.
    """

    def __init__(
        self,
        parse: Callable[..., list[Feedback]],
        *,
        seconds: float,
        start_seconds: float = START_SECONDS,
    ) -> None:
        if not seconds > 0:
            raise InvalidField("seconds", seconds, "above 0")
        try:
            self._pickled = pickle.dumps(parse)  # a reference: its module and name
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise TypeError(
                f"the parse function must be importable by name (a top-level function): {exc}"
            ) from None
        self._parse = parse
        self.seconds = seconds
        self._start_seconds = start_seconds
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None

    def __repr__(self) -> str:
        return f"IsolatedParser({self._parse!r}, seconds={self.seconds:g})"

    @property
    def pid(self) -> int | None:
        """The child's process id while one runs."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def __call__(self, raw: bytes, **kwargs: Any) -> list[Feedback]:
        with self._lock:
            conn = self._started()
            try:
                conn.send((raw, kwargs))
                if not conn.poll(self.seconds):
                    self._stop()
                    raise FeedbackParseFailed(
                        f"parsing took longer than its budget of {self.seconds:g} s; its "
                        f"parser process was killed ({_AGAIN})"
                    )
                status, value = conn.recv()
            except (EOFError, OSError):  # the socket broke or closed: the child is gone
                code = self._stop()
                raise FeedbackParseFailed(
                    f"its parser process died (exit code {code}); {_AGAIN}"
                ) from None
        if status != "ok":
            raise FeedbackParseFailed(f"the parser raised {value}")
        items: list[Feedback] = value
        return items

    def close(self) -> None:
        """Stop the child: it exits when its socket closes (killed if it has not within two
        seconds). Waits for a parse in progress, which lasts at most the budget."""
        with self._lock:
            self._stop(_EXIT_SECONDS)

    # -- the child ----------------------------------------------------------------------------

    def _started(self) -> Connection:
        """The running child's socket, a new child started when there is none."""
        process, conn = self._process, self._conn
        if process is not None and conn is not None and process.poll() is None:
            return conn
        self._stop()  # what a dead child left behind
        ours, theirs = multiprocessing.Pipe(duplex=True)  # a socket pair
        fd = theirs.fileno()
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(fd), json.dumps(sys.path)],
                pass_fds=(fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # a print must not reach `feedback poll --json`
            )
        except OSError as exc:
            ours.close()
            raise FeedbackUnavailable(f"the feedback parser process did not start: {exc}") from exc
        finally:
            theirs.close()  # the child's copy is its own; ours would hide its EOF
        self._process, self._conn = process, ours
        try:
            ours.send_bytes(self._pickled)
            ready = ours.poll(self._start_seconds) and ours.recv() == _READY
        except (EOFError, OSError):
            ready = False
        if not ready:
            code = self._stop()
            raise FeedbackUnavailable(
                f"the feedback parser process did not start within {self._start_seconds:g} s "
                f"(exit code {code})"
            )
        log.debug("feedback parser process %s started", process.pid)
        return ours

    def _stop(self, grace: float = 0.0) -> int | None:
        """Close the socket and end the child, killed unless it exits within ``grace`` seconds;
        its exit code (None: there was none, or it would not die)."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if conn is not None:
            conn.close()
        if process is None:
            return None
        try:
            return process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
        try:
            return process.wait(5)
        except subprocess.TimeoutExpired:  # unkillable (stopped in the kernel): left to the OS
            log.warning("the feedback parser process %s would not die", process.pid)
            return None
