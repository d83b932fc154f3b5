"""Operations on a whole deployment, below the services: they may use adapters directly.

- :mod:`sendqueue.ops.backup`: a consistent copy of the SQLite files (``sendqueue db backup``).
- :mod:`sendqueue.ops.migrate_to`: moving an embedded deployment onto PostgreSQL
  (``sendqueue db migrate-to``).
"""

__all__: list[str] = []
