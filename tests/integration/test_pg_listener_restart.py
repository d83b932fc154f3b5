"""PgListener: after close(), a later subscriber starts the listening thread again, even when
a subscriber was still subscribed at the close."""

from __future__ import annotations

import threading

from sendqueue.adapters.sql.signal import PgListener


def test_a_subscriber_after_close_starts_listening_again() -> None:
    opened = threading.Semaphore(0)

    def connect() -> object:
        opened.release()
        raise OSError("no database here")  # the thread retries with backoff

    listener = PgListener(connect, max_backoff=0.05)
    first = listener.subscribe(lambda: None)
    try:
        assert opened.acquire(timeout=2)
        listener.close()
        while opened.acquire(timeout=0.3):  # let the stopped thread wind down
            pass
        second = listener.subscribe(lambda: None)
        try:
            assert opened.acquire(timeout=2), "nothing listens after close and a new subscriber"
        finally:
            second()
    finally:
        first()
        listener.close()
