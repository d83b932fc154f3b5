"""In-memory fakes of every port, shipped with the package so users can test against them.

Each fake honours its port's contract and runs the same contract tests as the real adapters.
"""

from sendqueue.testing.clock import FakeClock, SystemClock

__all__ = ["FakeClock", "SystemClock"]
