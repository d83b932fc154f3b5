"""Creating or upgrading a deployment's database schemas: ``sendqueue db upgrade``."""

from __future__ import annotations

from dataclasses import dataclass

from sendqueue.adapters.migrate import current, upgrade

__all__ = ["SchemaVersions", "upgrade_database"]


@dataclass(frozen=True)
class SchemaVersions:
    """Where the schemas are after an upgrade: the task store's Alembic revision, and
    procrastinate's schema version when that execution layer shares the database."""

    store: str | None
    procrastinate: str | None = None


def upgrade_database(database_url: str, *, procrastinate: bool = False) -> SchemaVersions:
    """Apply the task store's migrations to ``database_url`` and, with ``procrastinate``,
    install or upgrade procrastinate's schema and the adapter's tables there too."""
    upgrade(database_url)
    version = None
    if procrastinate:
        # Imported here: procrastinate is an optional extra ('sendqueue[procrastinate]').
        from sendqueue.adapters.procrastinate_scheduler import upgrade_schema

        version = upgrade_schema(database_url)
    return SchemaVersions(current(database_url), version)
