"""The embedded execution layer: one-time schedules in their own SQLite file, and a dispatcher
(:mod:`~sendqueue.adapters.embedded.scheduler`)."""
