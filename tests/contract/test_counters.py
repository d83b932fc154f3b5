"""The Counters contract (sendqueue.ports.Counters), run against every backend of
:mod:`tests.contract.store_backends`.
"""

from __future__ import annotations

import threading

import pytest

from sendqueue.domain.errors import InvalidField
from sendqueue.ports import TaskStore
from tests.contract.store_backends import Backend, backend, store

__all__ = ["backend", "store"]  # the fixtures: every backend's store


# --- counters ---------------------------------------------------------------------------------


def test_counters_start_at_zero_count_up_and_are_shared_by_handles(backend: Backend) -> None:
    one, other = backend.handle(), backend.handle()
    assert one.counter("session-generation") == 0
    assert one.increment_counter("session-generation") == 1
    assert other.counter("session-generation") == 1  # another handle (process) sees it at once
    assert other.increment_counter("session-generation") == 2
    assert one.counter("session-generation") == 2
    assert one.counter("other") == 0  # names are independent
    for bad in ("", "x" * 201):
        with pytest.raises(InvalidField) as caught:
            one.counter(bad)
        assert caught.value.field == "name"
        with pytest.raises(InvalidField):
            one.increment_counter(bad)


def test_concurrent_increments_all_count(backend: Backend) -> None:
    handles = [backend.handle() for _ in range(4)]
    barrier = threading.Barrier(len(handles))
    seen: list[int] = []
    lock = threading.Lock()

    def bump(store: TaskStore) -> None:
        barrier.wait()
        for _ in range(5):
            value = store.increment_counter("c")
            with lock:
                seen.append(value)

    threads = [threading.Thread(target=bump, args=(h,)) for h in handles]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Every increment returned its own new value: none lost, none repeated.
    assert sorted(seen) == list(range(1, 21))
    assert handles[0].counter("c") == 20
