"""The Leases contract (sendqueue.ports.Leases), run against every backend of
:mod:`tests.contract.store_backends`.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from sendqueue.domain.errors import InvalidField
from sendqueue.ports import TaskStore
from tests.contract.store_backends import T0, backend, store

__all__ = ["backend", "store"]  # the fixtures: every backend's store


# --- leases -----------------------------------------------------------------------------------


def test_leases_acquire_renew_contend_expire_release(store: TaskStore) -> None:
    ttl = 60.0
    assert store.acquire_lease("reconciler", "a", ttl_seconds=ttl, at=T0)
    assert not store.acquire_lease(
        "reconciler", "b", ttl_seconds=ttl, at=T0 + timedelta(seconds=30)
    )
    # Renewal by the owner extends the lease.
    assert store.acquire_lease("reconciler", "a", ttl_seconds=ttl, at=T0 + timedelta(seconds=50))
    assert not store.acquire_lease(
        "reconciler", "b", ttl_seconds=ttl, at=T0 + timedelta(seconds=100)
    )
    # Other names are independent.
    assert store.acquire_lease("other", "b", ttl_seconds=ttl, at=T0)
    # Expired (at the very instant it ends): free for anyone.
    assert store.acquire_lease("reconciler", "b", ttl_seconds=ttl, at=T0 + timedelta(seconds=110))
    assert not store.acquire_lease(
        "reconciler", "a", ttl_seconds=ttl, at=T0 + timedelta(seconds=111)
    )
    # Only the owner can release.
    store.release_lease("reconciler", "a")
    assert not store.acquire_lease(
        "reconciler", "a", ttl_seconds=ttl, at=T0 + timedelta(seconds=112)
    )
    store.release_lease("reconciler", "b")
    assert store.acquire_lease("reconciler", "a", ttl_seconds=ttl, at=T0 + timedelta(seconds=113))
    store.release_lease("never-taken", "a")
    with pytest.raises(InvalidField):
        store.acquire_lease("x", "a", ttl_seconds=0, at=T0)
