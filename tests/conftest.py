"""Shared fixtures: real services where the machine has them.

A test that needs a missing server skips with a clear reason on a laptop, and fails when
``SENDQUEUE_REQUIRE_SERVICES=1`` (which ``.ci/run`` sets), so CI never passes by skipping.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import psycopg

pytest_plugins = ["tests.support.smtp", "tests.support.mailservers", "tests.support.oauth"]

REQUIRE_SERVICES = os.environ.get("SENDQUEUE_REQUIRE_SERVICES") == "1"
# Starlette's TestClient sends "Host: testserver", the raw-socket tests "Host: test"; the app
# answers only the hosts it is told to (tests/security/test_rebinding.py checks the refusal
# of any other).
os.environ.setdefault("SENDQUEUE_ALLOWED_HOSTS", "testserver,test")
POSTGRES_ADMIN_URL = os.environ.get(
    "SENDQUEUE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"
)


def missing(reason: str) -> None:
    """Skip locally, fail in CI: a missing service must never make CI green."""
    if REQUIRE_SERVICES:
        pytest.fail(f"required service missing in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def _admin_connect() -> psycopg.Connection[tuple[Any, ...]]:
    try:
        import psycopg
    except ImportError:  # pragma: no cover - the postgres extra is part of dev
        missing("psycopg is not installed (pip install -e '.[postgres]')")
        raise
    try:
        return psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        missing(f"PostgreSQL not reachable at {POSTGRES_ADMIN_URL}: {exc}".strip())
        raise


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards.

    Yields a SQLAlchemy URL (``postgresql+psycopg://...``).
    """
    name = f"sq_test_{secrets.token_hex(6)}"
    with _admin_connect() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield base.replace("postgresql://", "postgresql+psycopg://", 1) + "/" + name
    finally:
        with _admin_connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
