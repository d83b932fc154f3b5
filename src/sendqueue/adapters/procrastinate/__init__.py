"""The procrastinate execution layer (``SENDQUEUE_EXECUTION=procrastinate``).

:mod:`.scheduler` holds :class:`~.scheduler.ProcrastinateScheduler` (the Scheduler and
Dispatcher ports), :mod:`.jobs` how schedules map onto procrastinate's jobs, :mod:`.worker` the
worker app and :mod:`.schema` the schema upgrades. Nothing is imported here: procrastinate is
an optional extra (``sendqueue[procrastinate]``).
"""

__all__: list[str] = []
