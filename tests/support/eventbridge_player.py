"""Plays EventBridge Scheduler and Lambda's asynchronous invocation for tests on moto.

moto stores schedules but never fires them. :class:`EventBridgePlayer` does what AWS would at a
moment of the test's clock: it lists the schedules of the dedicated group, reads each one, and
for every one that is due hands its ``Input`` to the send handler, then deletes the schedule
(``ActionAfterCompletion`` DELETE). What can go wrong is played too, decided per schedule by
the test's predicates:

- ``early(name)``: the schedule is due from the start of the minute of its ``at()`` time, as
  AWS may fire it ("between 1:00:00 and 1:00:59" for 1:00); otherwise at the time itself. By
  default every schedule fires early, the worst AWS allows;

- ``duplicate(name)``: the event is delivered twice at the same moment (delivery is
  at-least-once), two handler calls in two threads. Give the store moto's one-request-at-a-time
  endpoint (:func:`tests.support.aws.dynamodb_url`): on the plain server moto's transactions
  are not atomic, and two concurrent claims of one task can both win there, which they cannot
  on DynamoDB;
- ``handoff_fails(name, attempt)``: the Scheduler cannot hand the event to Lambda on that
  attempt; it retries up to the schedule's ``RetryPolicy.MaximumRetryAttempts`` and then sends
  the ``Input`` to the ``DeadLetterConfig`` queue with the Scheduler's message attributes;
- ``fails_after(name, attempt)``: the function ran the handler but the invocation failed
  afterwards (say it timed out); a handler that raises fails the same way. Lambda retries an
  asynchronous invocation twice more (``EventInvokeConfig``), then its on-failure destination
  writes a record (``requestPayload``, ``responsePayload``) to the same queue.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from sendqueue.ports import Clock

__all__ = ["EventBridgePlayer", "FakeContext", "FireReport"]

#: Lambda's own retries of a failed asynchronous invocation (the template's EventInvokeConfig).
LAMBDA_RETRIES = 2


class FakeContext:
    """A Lambda context: the function's ARN and the milliseconds left.

    ``remaining_ms`` is where the clock starts; every call of
    :meth:`get_remaining_time_in_millis` then spends ``spend_ms`` of it, so a test decides
    exactly after how many questions the time runs out.
    """

    def __init__(self, function_arn: str, remaining_ms: int, *, spend_ms: int = 0) -> None:
        self.invoked_function_arn = function_arn
        self._left = remaining_ms
        self._spend = spend_ms
        self.asked = 0

    def get_remaining_time_in_millis(self) -> int:
        left = self._left
        self._left = max(0, self._left - self._spend)
        self.asked += 1
        return left


@dataclass
class FireReport:
    """What one :meth:`EventBridgePlayer.fire_due` did."""

    fired: list[str] = field(default_factory=list)
    invocations: int = 0
    duplicates: int = 0
    handoff_failures: int = 0
    function_failures: int = 0
    #: what the failed invocations raised (or were played to), "schedule: type: message"
    errors: list[str] = field(default_factory=list)
    dead_lettered: list[str] = field(default_factory=list)


class EventBridgePlayer:
    """Fires due schedules of ``group`` at ``handler``; see the module docstring."""

    def __init__(
        self,
        scheduler_client: Any,
        sqs_client: Any,
        *,
        group: str,
        dead_letter_url: str,
        handler: Callable[[Mapping[str, Any], Any], object],
        clock: Clock,
        context: Callable[[], Any],
        early: Callable[[str], bool] = lambda name: True,
        duplicate: Callable[[str], bool] = lambda name: False,
        handoff_fails: Callable[[str, int], bool] = lambda name, attempt: False,
        fails_after: Callable[[str, int], bool] = lambda name, attempt: False,
    ) -> None:
        self._scheduler = scheduler_client
        self._sqs = sqs_client
        self._group = group
        self._dlq_url = dead_letter_url
        self._handler = handler
        self._clock = clock
        self._context = context
        self._early = early
        self._duplicate = duplicate
        self._handoff_fails = handoff_fails
        self._fails_after = fails_after

    def _due(self) -> list[dict[str, Any]]:
        """The schedules due at the clock's now (from their minute's start if they fire
        ``early``), in the order of their times (names break ties)."""
        names: list[str] = []
        args: dict[str, Any] = {"GroupName": self._group, "MaxResults": 100}
        while True:
            page = self._scheduler.list_schedules(**args)
            names += [s["Name"] for s in page.get("Schedules", [])]
            if not page.get("NextToken"):
                break
            args["NextToken"] = page["NextToken"]
        now = self._clock.now()
        due: list[tuple[datetime, str, dict[str, Any]]] = []
        for name in names:
            found = self._scheduler.get_schedule(Name=name, GroupName=self._group)
            expression = found["ScheduleExpression"]
            assert expression.startswith("at(") and expression.endswith(")"), expression
            zone = ZoneInfo(found.get("ScheduleExpressionTimezone") or "UTC")
            at = datetime.fromisoformat(expression[3:-1]).replace(tzinfo=zone)
            fires = at.replace(second=0, microsecond=0) if self._early(name) else at
            if fires <= now:
                due.append((at, name, found))
        return [found for _, _, found in sorted(due, key=lambda d: (d[0], d[1]))]

    def fire_due(self) -> FireReport:
        """Fire every schedule due now, one after the other; returns what happened."""
        report = FireReport()
        for found in self._due():
            self._fire(found, report)
        return report

    def _fire(self, found: Mapping[str, Any], report: FireReport) -> None:
        name = str(found["Name"])
        target = found["Target"]
        event = json.loads(target["Input"])
        retries = int(target.get("RetryPolicy", {}).get("MaximumRetryAttempts", 185))
        attempts = retries + 1
        for attempt in range(attempts):
            if self._handoff_fails(name, attempt):
                report.handoff_failures += 1
                continue
            # Lambda accepted the event: the schedule is complete, whatever the function does.
            report.fired.append(name)
            self._scheduler.delete_schedule(Name=name, GroupName=self._group)
            self._run_function(name, event, found, report)
            return
        report.dead_lettered.append(name)
        self._sqs.send_message(
            QueueUrl=self._dlq_url,
            MessageBody=target["Input"],
            MessageAttributes={
                key: {"DataType": "String", "StringValue": value}
                for key, value in {
                    "ERROR_CODE": "AWS.Lambda.TooManyRequestsException",
                    "ERROR_MESSAGE": "Rate exceeded (played by the test)",
                    "EXHAUSTED_RETRY_CONDITION": "MaximumRetryAttempts",
                    "RETRY_ATTEMPTS": str(retries),
                    "SCHEDULE_ARN": str(found.get("Arn", name)),
                    "TARGET_ARN": str(target["Arn"]),
                }.items()
            },
        )
        self._scheduler.delete_schedule(Name=name, GroupName=self._group)

    def _run_function(
        self, name: str, event: dict[str, Any], found: Mapping[str, Any], report: FireReport
    ) -> None:
        """Lambda's asynchronous invocation: the first try and up to two retries."""
        last: dict[str, str] = {}
        for attempt in range(1 + LAMBDA_RETRIES):
            errors = self._invoke(name, event, report)
            if not errors and self._fails_after(name, attempt):
                errors = [{"errorType": "Sandbox.Timedout", "errorMessage": "played timeout"}]
            if not errors:
                return
            report.function_failures += 1
            report.errors += [f"{name}: {e['errorType']}: {e['errorMessage']}" for e in errors]
            last = errors[0]
        report.dead_lettered.append(name)
        record = {
            "version": "1.0",
            "requestContext": {
                "condition": "RetriesExhausted",
                "approximateInvokeCount": 1 + LAMBDA_RETRIES,
                "functionArn": str(found["Target"]["Arn"]),
            },
            "requestPayload": event,
            "responsePayload": last,
        }
        self._sqs.send_message(QueueUrl=self._dlq_url, MessageBody=json.dumps(record))

    def _invoke(self, name: str, event: dict[str, Any], report: FireReport) -> list[dict[str, str]]:
        """Call the handler once, or twice at the same time; the errors the calls raised."""
        errors: list[dict[str, str]] = []
        lock = threading.Lock()
        start = threading.Barrier(2)

        def call(together: bool) -> None:
            try:
                if together:
                    start.wait(timeout=10)
                self._handler(json.loads(json.dumps(event)), self._context())
            except Exception as exc:
                with lock:
                    errors.append({"errorType": type(exc).__name__, "errorMessage": str(exc)})

        if not self._duplicate(name):
            report.invocations += 1
            call(False)
            return errors
        report.duplicates += 1
        report.invocations += 2
        threads = [threading.Thread(target=call, args=(True,)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # Either of the two failing is a failed invocation for Lambda, which retries it.
        return errors
