"""The process heap after start-up: :func:`settle_heap`, which the entry points call once their
container is built."""

from __future__ import annotations

import gc
import threading

__all__ = ["settle_heap"]

_settled = threading.Event()
#: Net new objects between two young collections after start-up (CPython's default: 700).
_YOUNG_THRESHOLD = 10_000


def settle_heap() -> None:
    """Once per process, when start-up is over (the CLI's and the Lambda handlers' container is
    built): collect what start-up left behind, freeze the rest (``gc.freeze``), and collect
    the young generation after 10,000 net new objects instead of 700, so start-up's long-lived
    objects are not walked again and again (the measurements: docs/performance-history.md).
    Not done by :func:`bootstrap`: a program that embeds sendqueue decides about its heap."""
    if _settled.is_set():
        return
    _settled.set()
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(_YOUNG_THRESHOLD, older, oldest)
