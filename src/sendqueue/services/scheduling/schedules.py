"""Writing schedules for tasks: bounded concurrency, throttling back-off, conflict repair.

Provisioning, resume, retry-failed, the worker's transient retries and the reconciler all create
schedules the same way, through :class:`ScheduleWriter`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import cast
from zoneinfo import ZoneInfo

from sendqueue.domain.errors import Conflict, SchedulerError, Throttled
from sendqueue.domain.models import Task, expected_schedule_name, schedule_group, schedule_name
from sendqueue.domain.wording import plural
from sendqueue.ports import BackgroundBulkScheduler, BulkScheduler, DueArgs, Scheduler

__all__ = ["ScheduleWriter", "WriteReport", "send_payload"]

log = logging.getLogger(__name__)

#: Schedules per ``create_many`` call (one transaction of the execution layer).
_BULK_CHUNK = 1000

#: The execution layer's default retries of a failed invocation (``Scheduler.create``'s).
_MAX_RETRIES = 2


def _bulk_writer(
    scheduler: Scheduler,
) -> Callable[[Sequence[DueArgs]], Sequence[object]] | None:
    """``create_many`` of a :class:`BulkScheduler`, else None.

    The class is checked, not the instance: a wrapper that forwards unknown attributes to a
    bulk-capable scheduler (a fault injector, a metrics decorator) must see each create itself.
    """
    if issubclass(type(scheduler), BulkScheduler):
        return cast(BulkScheduler, scheduler).create_many
    return None


def _background_writer(
    scheduler: Scheduler,
) -> Callable[[Sequence[DueArgs]], Callable[[], Sequence[object]]] | None:
    """``submit_many`` of a :class:`BackgroundBulkScheduler` (checked on the class, as
    :func:`_bulk_writer` does), else None."""
    if issubclass(type(scheduler), BackgroundBulkScheduler):
        return cast(BackgroundBulkScheduler, scheduler).submit_many
    return None


def send_payload(task: Task) -> dict[str, str]:
    """What a task's schedule passes to the send worker.

    The token lets the worker recognise a schedule that is no longer the task's current one
    (e.g. left over from before a pause) and skip it.
    """
    return {"kind": "send", "task_id": task.id, "token": task.token}


@dataclass
class WriteReport:
    """What a batch of schedule writes did."""

    created: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    throttled: int = 0
    #: Tasks whose name was held under another token, left alone (``replace=False``).
    kept: list[str] = field(default_factory=list)


class ScheduleWriter:
    """Creates and deletes schedules with at most ``concurrency`` scheduler calls in flight.

    Throttling is retried with exponential back-off and full jitter, up to ``max_tries`` calls
    per schedule; a name clash with another token (a stale schedule of the same task attempt)
    is repaired by deleting the stale one and creating it again. The caller names the tasks it
    has just moved (given a new token): their clash is expected and logged at DEBUG; any other
    clash is a WARNING.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        timezone_of: Callable[[str], str],
        *,
        concurrency: int = 10,
        max_tries: int = 8,
        base_backoff: float = 0.05,
        max_backoff: float = 5.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._scheduler = scheduler
        self._timezone_of = timezone_of
        self._concurrency = concurrency
        self._max_tries = max_tries
        self._base = base_backoff
        self._cap = max_backoff
        self._sleep = sleep
        self._random = random.Random()

    @property
    def concurrency(self) -> int:
        return self._concurrency

    def _with_backoff(self, call: Callable[[], object], report: WriteReport) -> None:
        for attempt in range(self._max_tries):
            try:
                call()
                return
            except Throttled:
                report.throttled += 1
                if attempt == self._max_tries - 1:
                    raise
                delay = min(self._cap, self._base * 2**attempt)
                self._sleep(self._random.uniform(0, delay))

    def ensure(self, task: Task, *, moved: bool = False) -> None:
        """Create the schedule a Pending task must have (``moved``: its token has just changed,
        so its old schedule is expected under the name); raises SchedulerError on failure."""
        self._ensure(task, WriteReport(), moved=moved)

    def _ensure(
        self, task: Task, report: WriteReport, replace: bool = True, *, moved: bool = False
    ) -> bool:
        """Create the task's schedule; False when its name was held under another token and
        ``replace`` is off (the schedule then stays as it is)."""
        name = expected_schedule_name(task)
        zone_name = self._timezone_of(task.campaign_id)
        at_local = task.send_at.astimezone(ZoneInfo(zone_name)).replace(tzinfo=None)

        def create() -> object:
            return self._scheduler.create(
                name,
                schedule_group(task.campaign_id),
                at_local,
                zone_name,
                send_payload(task),
                task.token,
            )

        try:
            self._with_backoff(create, report)
        except Conflict:
            if not replace:
                report.kept.append(task.id)
                return False
            if moved:  # the schedule of its time before the move
                log.debug("schedule %s: moved task, its old schedule replaced", name)
            else:
                log.warning("schedule %s exists with another token; replacing it", name)
            self._with_backoff(lambda: self._scheduler.delete(name), report)
            try:
                self._with_backoff(create, report)
            except Conflict as exc:  # held by what delete cannot remove: this task fails alone
                raise SchedulerError(f"schedule {name} stays held after its delete: {exc}") from exc
        return True

    def ensure_many(
        self, tasks: Sequence[Task], *, replace: bool = True, moved: Collection[str] = ()
    ) -> WriteReport:
        """Create schedules for ``tasks``, at most ``concurrency`` calls in flight.

        Failures are collected in the report (task id, error), not raised, so one bad call does
        not lose the rest of the batch; the caller decides (provisioning stops and keeps its
        checkpoint, the reconciler retries on its next pass). With ``replace`` off, a name held
        under another token is left as it is and reported in ``kept`` (the reconciler: what
        someone made after it checked is newer than its read). ``moved`` names the tasks just
        moved (new token): their old schedule is expected under the name.
        """
        report = WriteReport()
        if not tasks:
            return report

        def one(task: Task) -> None:
            self._one(task, report, replace, moved)

        bulk = _bulk_writer(self._scheduler)
        if bulk is not None and len(tasks) > 1:
            # one create_many per part, each called when its part is settled
            for part, written in self._bulk_parts(tasks, lambda items: lambda: bulk(items)):
                self._settle_bulk(written, part, report, replace, moved)
            return report
        if self._concurrency == 1 or len(tasks) == 1:
            for task in tasks:
                one(task)
            return report
        with ThreadPoolExecutor(
            max_workers=min(self._concurrency, len(tasks)), thread_name_prefix="schedule-writer"
        ) as pool:
            list(pool.map(one, tasks))
        return report

    def start_many(self, tasks: Sequence[Task]) -> Callable[[], WriteReport]:
        """:meth:`ensure_many` that may still be writing when it returns; call the result to
        wait for the writes and get the report.

        With a layer that writes in the background (:class:`~sendqueue.ports.
        BackgroundBulkScheduler`, the embedded one) the schedules' values are built here
        and the layer writes them while the caller goes on (provisioning writes the next
        chunk's tasks meanwhile); with any other layer this is :meth:`ensure_many`, done
        before it returns.
        """
        background = _background_writer(self._scheduler)
        if background is None or len(tasks) <= 1:
            report = self.ensure_many(tasks)
            return lambda: report
        report = WriteReport()
        started = self._bulk_parts(tasks, background)

        def wait() -> WriteReport:
            for part, written in started:
                self._settle_bulk(written, part, report, True, ())
            return report

        return wait

    def _bulk_parts(
        self,
        tasks: Sequence[Task],
        write: Callable[[Sequence[DueArgs]], Callable[[], Sequence[object]]],
    ) -> list[tuple[Sequence[Task], Callable[[], Sequence[object]]]]:
        """``write`` of each part of ``tasks`` (:data:`_BULK_CHUNK` a part, one transaction of
        the layer: the embedded and procrastinate ones), with the call that returns its
        results, for :meth:`_settle_bulk`."""
        zones: dict[str, tuple[str, str]] = {}
        parts = [tasks[start : start + _BULK_CHUNK] for start in range(0, len(tasks), _BULK_CHUNK)]
        return [(part, write([self._due_args(task, zones) for task in part])) for part in parts]

    def _settle_bulk(
        self,
        written: Callable[[], Sequence[object]],
        tasks: Sequence[Task],
        report: WriteReport,
        replace: bool,
        moved: Collection[str],
    ) -> None:
        """The report of a bulk write of ``tasks`` (``written`` returns its results): name
        clashes are repaired one by one, and a failed batch is retried one by one, so each
        task's failure is reported on its own (``moved``: as :meth:`ensure_many`'s)."""
        try:
            results = written()
        except SchedulerError as exc:
            log.warning("bulk schedule write failed (%s); writing one by one", exc)
            for task in tasks:
                self._one(task, report, replace, moved)
            return
        for task, result in zip(tasks, results, strict=True):
            if isinstance(result, Conflict):
                if replace:
                    self._one(task, report, replace, moved)  # replaces the stale one
                else:
                    report.kept.append(task.id)
            else:
                report.created += 1

    def _one(self, task: Task, report: WriteReport, replace: bool, moved: Collection[str]) -> None:
        """One task's schedule, its failure collected in ``report``."""
        try:
            if self._ensure(task, report, replace, moved=task.id in moved):
                report.created += 1
        except SchedulerError as exc:
            report.failed.append((task.id, str(exc) or type(exc).__name__))

    def _due_args(self, task: Task, zones: dict[str, tuple[str, str]]) -> DueArgs:
        """``create_many``'s item for ``task``: its ``send_at`` is the instant, read in its
        campaign's zone by the layer; ``zones`` caches each campaign's zone name and group."""
        zone = zones.get(task.campaign_id)
        if zone is None:
            zone = zones[task.campaign_id] = (
                self._timezone_of(task.campaign_id),
                schedule_group(task.campaign_id),
            )
        # schedule_name() as expected_schedule_name(task) calls it: one call less per task.
        name = schedule_name(task.id, task.attempts)
        return (name, zone[1], task.send_at, zone[0], send_payload(task), task.token, _MAX_RETRIES)

    def missing(self, names: Sequence[str]) -> set[str]:
        """Which of ``names`` have no schedule now: a ``get`` each, at most ``concurrency`` in
        flight, throttling backed off as for writes. Any other failure raises
        SchedulerError."""
        found: dict[str, bool] = {}

        def one(name: str) -> None:
            def get() -> None:
                found[name] = self._scheduler.get(name) is not None

            self._with_backoff(get, WriteReport())

        if self._concurrency == 1 or len(names) <= 1:
            for name in names:
                one(name)
        else:
            with ThreadPoolExecutor(
                max_workers=min(self._concurrency, len(names)),
                thread_name_prefix="schedule-writer",
            ) as pool:
                list(pool.map(one, names))
        return {name for name in names if not found[name]}

    def delete_many(self, names: Iterable[str]) -> WriteReport:
        """Delete schedules by name (missing ones are fine), ``concurrency`` calls in flight."""
        report = WriteReport()
        names = list(names)

        def one(name: str) -> None:
            try:
                self._with_backoff(lambda: self._scheduler.delete(name), report)
                report.created += 1
            except SchedulerError as exc:
                report.failed.append((name, str(exc) or type(exc).__name__))

        if not names:
            return report
        with ThreadPoolExecutor(
            max_workers=min(self._concurrency, len(names)), thread_name_prefix="schedule-writer"
        ) as pool:
            list(pool.map(one, names))
        return report

    def delete_group(self, group: str, *, keep: Callable[[str], bool] = lambda _: False) -> int:
        """Delete every schedule in ``group`` except those ``keep`` names. Returns how many."""
        names: list[str] = []
        after: str | None = None
        while True:
            page = self._scheduler.list(group, after=after, limit=1000)
            names.extend(s.name for s in page if not keep(s.name))
            if len(page) < 1000:
                break
            after = page[-1].name
        report = self.delete_many(names)
        if report.failed:
            log.warning(
                "%s failed in %s; the reconciler will retry",
                plural(len(report.failed), "schedule delete"),
                group,
            )
        return report.created
