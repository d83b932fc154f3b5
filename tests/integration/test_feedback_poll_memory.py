"""The memory one poll holds, through a real Dovecot: 200 messages of 1 MiB are read one
after the other, never as a batch held at once (the bound is 64 MB above the baseline).

Red team: a poll held the whole batch of 200 bodies in a list (and the IMAP source 100 of them
per FETCH besides), 483 MB at its peak, in the web process of ``sendqueue serve``.
"""

from __future__ import annotations

import gc
import tracemalloc
from datetime import datetime
from typing import Any

from sendqueue.adapters.imap import ImapFeedbackSource
from sendqueue.adapters.imap.source import MAX_MESSAGE_BYTES
from sendqueue.bootstrap import bootstrap
from sendqueue.domain.feedback import Feedback
from sendqueue.settings import Settings
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.store import InMemoryTaskStore
from tests.support.mailservers import Dovecot

MIB = 1024 * 1024
#: The most the poll may allocate above what the process held before it.
BOUND = 64 * MIB

_sizes: list[int] = []


def _measure(raw: bytes, *, received_at: datetime, **_: Any) -> list[Feedback]:
    """Notes each message's size and finds no feedback in it (the poll's own memory is
    measured, not a parser's)."""
    _sizes.append(len(raw))
    return []


def big_message(n: int) -> bytes:
    """A plain message of a little over 1 MiB (headers, then lines of text)."""
    head = (
        f"From: writer{n}@example.org\r\nTo: bounces@example.com\r\n"
        f"Subject: a long letter {n}\r\nMessage-ID: <big{n}@example.org>\r\n\r\n"
    ).encode()
    line = (f"{n:06d} " + "x" * 69 + "\r\n").encode()
    return head + line * (MIB // len(line) + 1)


def test_a_poll_of_200_messages_of_1_mib_stays_within_64_mb(dovecot: Dovecot) -> None:
    for n in range(200):
        dovecot.deliver(big_message(n))
    app = bootstrap(
        Settings(_env_file=None),
        store=InMemoryTaskStore(),
        mailer=RecordingMailer(),
        feedback_sources=[ImapFeedbackSource.from_url(dovecot.url)],
        parse_feedback=_measure,
    )
    _sizes.clear()
    try:
        poller = app.feedback_poller
        gc.collect()
        tracemalloc.start()
        try:
            baseline = tracemalloc.get_traced_memory()[0]
            report = poller.poll()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    finally:
        app.close()
    assert (report.messages, report.not_feedback, report.errors) == (200, 200, [])
    assert _sizes == [MAX_MESSAGE_BYTES] * 200  # every one read, to the source's bound
    growth = peak - baseline
    print(f"\npoll of 200 x 1 MiB: peak {growth / MIB:.1f} MiB above the baseline")
    assert growth < BOUND, f"{growth / MIB:.0f} MiB above the baseline"
