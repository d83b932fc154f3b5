"""A parse function for the isolated parser's tests, importable by name (its child process
imports it): the first word of a message says what it does."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime
from typing import Any

from sendqueue.domain.feedback import Feedback, FeedbackKind

__all__ = ["scripted"]


def scripted(raw: bytes, *, received_at: datetime, **kwargs: Any) -> list[Feedback]:
    """``sleep``: takes a minute (past any budget of the tests); ``die``: the process is
    killed; ``boom``: raises; ``kwargs``: a reply whose detail is the keyword arguments it got
    (JSON, values as repr); ``nice``: a reply whose detail is the process's niceness;
    ``reply <task id>``: a reply to that task; anything else: nothing.
    """
    word, _, rest = raw.partition(b" ")
    if word == b"sleep":
        time.sleep(60)
    elif word == b"die":
        os.kill(os.getpid(), signal.SIGKILL)
    elif word == b"boom":
        raise ValueError("unparseable\nand a second line")
    elif word == b"kwargs":
        got = {"received_at": repr(received_at)} | {k: repr(v) for k, v in kwargs.items()}
        detail = json.dumps(got, sort_keys=True)
        return [Feedback(FeedbackKind.REPLY, received_at, recipient="a@example.org", detail=detail)]
    elif word == b"nice":  # the process's CPU priority, in the detail
        return [
            Feedback(
                FeedbackKind.REPLY, received_at, recipient="a@example.org", detail=str(os.nice(0))
            )
        ]
    elif word == b"reply":
        key = kwargs.get("key")
        return [Feedback(FeedbackKind.REPLY, received_at, task_id=rest.decode(), key=key)]
    return []
