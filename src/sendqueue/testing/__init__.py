"""In-memory fakes of every port, shipped with the package so users can test against them,
and a builder of tasks to fill a store with.

Each fake honours its port's contract and runs the same contract tests as the real adapters.
"""

from sendqueue.testing.alarm import RecordingAlarm
from sendqueue.testing.clock import FakeClock, SystemClock
from sendqueue.testing.events import RecordingEvents
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from sendqueue.testing.store import InMemoryTaskStore
from sendqueue.testing.tasks import bare_task

__all__ = [
    "FakeClock",
    "FakeScheduler",
    "InMemoryTaskStore",
    "RecordingAlarm",
    "RecordingEvents",
    "RecordingMailer",
    "SystemClock",
    "bare_task",
]
