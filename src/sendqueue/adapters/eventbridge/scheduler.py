"""The AWS execution layer: one EventBridge Scheduler one-time schedule per task.

Every schedule is what the production design creates:

- ``Name`` is the port's name (derived from the task id), in one dedicated ``GroupName``
  (``physical_group``, created by the template). The port's own group (a campaign's
  ``sq-<campaign>``) is kept in the schedule's ``Description`` with the client token and the
  creation instant, because ``GetSchedule`` returns neither the token nor a group of ours.
- ``ScheduleExpression`` ``at(yyyy-mm-ddThh:mm:ss)`` in local wall-clock time, with
  ``ScheduleExpressionTimezone`` the campaign's IANA zone. EventBridge works to the minute:
  "if you set your schedule to run at 1:00, it will invoke the target API between 1:00:00 and
  1:00:59" (AWS, Schedule types). So a schedule at 10:30:15 may fire at 10:30:00, up to 59 s
  before its time; :attr:`EventBridgeScheduler.firing_precision` (60) tells the send worker,
  which then sends from the start of the send time's minute instead of skipping the invocation
  as early.
- ``FlexibleTimeWindow`` OFF and ``ActionAfterCompletion`` DELETE: the schedule deletes itself
  after it invoked the target.
- ``ClientToken`` is the task's stored token.
- ``Target``: the send function's ARN, a role that may invoke only that function, ``Input``
  the payload as JSON (``task_id`` spelled ``taskId``, ``campaign_id`` ``campaignId``, plus a
  ``sendqueue`` object naming the schedule, group and zone so a dead letter can be redriven),
  ``RetryPolicy`` with ``MaximumRetryAttempts`` = ``max_retries`` and a ``DeadLetterConfig`` on
  the SQS dead-letter queue.

Answers from AWS: ``ConflictException`` on create is resolved by reading the existing schedule
(the same token is success, another one is :class:`Conflict`); ``ResourceNotFoundException`` on
delete is success; ``ThrottlingException`` raises :class:`Throttled` (the ScheduleWriter backs
off with jitter); everything else raises :class:`SchedulerError`.

Firing, retries and the dead-letter queue are AWS's: there is no ``fire_due`` here. Dead
letters are the messages in the SQS queue, both the Scheduler's (the event could not be handed
to Lambda) and Lambda's on-failure destination records (the function failed three times).
"""

from __future__ import annotations

import builtins
import json
import logging
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from sendqueue.adapters.scheduler_rules import (
    build_schedule,
    check_group,
    check_limit,
    check_name,
    due_at,
    local_now,
)
from sendqueue.domain.errors import Conflict, NotChecked, NotFound, SchedulerError, Throttled
from sendqueue.domain.models import CONTROL_GROUP, DeadLetter, new_token
from sendqueue.ports import Clock, Schedule

if TYPE_CHECKING:
    from mypy_boto3_scheduler import EventBridgeSchedulerClient
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageTypeDef

__all__ = ["EventBridgeScheduler", "schedule_expression"]

log = logging.getLogger(__name__)

#: Payload keys renamed in the target's Input (the Lambda handlers' spelling).
_TO_INPUT = {"task_id": "taskId", "campaign_id": "campaignId"}
_FROM_INPUT = {v: k for k, v in _TO_INPUT.items()}
_META = "sendqueue"
_THROTTLED = {"ThrottlingException", "TooManyRequestsException", "RequestLimitExceeded"}
#: How long a peeked dead letter stays hidden before it is made visible again.
_PEEK_SECONDS = 30


def schedule_expression(at_local: datetime) -> str:
    """EventBridge's one-time expression for a wall-clock time: ``at(yyyy-mm-ddThh:mm:ss)``."""
    return f"at({at_local.strftime('%Y-%m-%dT%H:%M:%S')})"


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _wrap(exc: Exception, what: str) -> SchedulerError:
    if isinstance(exc, ClientError) and _code(exc) in _THROTTLED:
        return Throttled(f"EventBridge Scheduler throttled {what}: {exc}")
    return SchedulerError(f"EventBridge Scheduler failed to {what}: {exc}")


class EventBridgeScheduler:
    """:class:`~sendqueue.ports.Scheduler` on EventBridge Scheduler; see the module docstring.

    ``scheduler`` and ``sqs`` are boto3 clients; ``target_arn`` is the send function,
    ``role_arn`` the execution role that may invoke only it, ``dead_letter_url`` and
    ``dead_letter_arn`` the SQS queue.
    """

    #: Seconds: a one-time schedule fires anywhere in the minute of its ``at()`` time, so from
    #: the start of that minute on (see :class:`~sendqueue.ports.Scheduler`).
    firing_precision = 60.0

    def __init__(
        self,
        scheduler: EventBridgeSchedulerClient,
        sqs: SQSClient,
        *,
        physical_group: str,
        target_arn: str,
        role_arn: str,
        dead_letter_url: str,
        dead_letter_arn: str,
        clock: Clock,
    ) -> None:
        self._client = scheduler
        self._sqs = sqs
        self._group = check_group(physical_group)
        self._target_arn = target_arn
        self._role_arn = role_arn
        self._dlq_url = dead_letter_url
        self._dlq_arn = dead_letter_arn
        self._clock = clock

    def probe(self, timeout: float) -> str:
        """The schedule group is there (GetScheduleGroup; nothing written), see
        :class:`~sendqueue.ports.Probe`: NotChecked without AWS credentials here. The clients'
        own timeouts apply (boto3 fixes them when a client is made)."""
        try:
            found = self._client.get_schedule_group(Name=self._group)
        except NoCredentialsError as exc:
            raise NotChecked(
                "no AWS credentials in this environment (the Lambda functions use their role)"
            ) from exc
        except ClientError as exc:
            if _code(exc) == "ResourceNotFoundException":
                raise SchedulerError(
                    f"EventBridge Scheduler has no schedule group {self._group} (deploy the "
                    "SAM template, or set SENDQUEUE_SCHEDULE_GROUP to its group)"
                ) from exc
            raise _wrap(exc, f"read the schedule group {self._group}") from exc
        except BotoCoreError as exc:
            raise _wrap(exc, f"read the schedule group {self._group}") from exc
        state = found.get("State", "?")
        return f"EventBridge Scheduler group {self._group} ({state})"

    # -- writing ---------------------------------------------------------------------------
    def create(
        self,
        name: str,
        group: str,
        at_local: datetime,
        timezone: str,
        payload: Mapping[str, str],
        client_token: str,
        max_retries: int = 2,
    ) -> Schedule:
        # EventBridge's expression has whole seconds: the schedule we report is the one it keeps.
        schedule = build_schedule(
            name,
            group,
            at_local.replace(microsecond=0) if isinstance(at_local, datetime) else at_local,
            timezone,
            payload,
            client_token,
            max_retries,
            created_at=self._clock.now(),
        )
        try:
            self._put(schedule)
        except ClientError as exc:
            if _code(exc) != "ConflictException":
                raise _wrap(exc, f"create {name}") from exc
            existing = self.get(name)
            if existing is None:  # deleted between the two calls: try once more
                return self.create(
                    name, group, at_local, timezone, payload, client_token, max_retries
                )
            if existing.client_token != schedule.client_token:
                raise Conflict(
                    f"schedule {name} exists with another client token "
                    f"({existing.client_token}, not {client_token})"
                ) from exc
            return existing
        except BotoCoreError as exc:
            raise _wrap(exc, f"create {name}") from exc
        return schedule

    def _put(self, schedule: Schedule) -> None:
        created_at = schedule.created_at or self._clock.now()
        description = json.dumps(
            {
                "group": schedule.group,
                "token": schedule.client_token,
                "created": created_at.isoformat(),
            },
            separators=(",", ":"),
        )
        data: dict[str, object] = {_TO_INPUT.get(k, k): v for k, v in schedule.payload.items()}
        data[_META] = {"schedule": schedule.name, "group": schedule.group, "tz": schedule.timezone}
        args: dict[str, Any] = {
            "Name": schedule.name,
            "GroupName": self._group,
            "ScheduleExpression": schedule_expression(schedule.at_local),
            "ScheduleExpressionTimezone": schedule.timezone,
            "FlexibleTimeWindow": {"Mode": "OFF"},
            "ActionAfterCompletion": "DELETE",
            "ClientToken": schedule.client_token,
            "Description": description,
            "State": "ENABLED",
            "Target": {
                "Arn": self._target_arn,
                "RoleArn": self._role_arn,
                "Input": json.dumps(data, separators=(",", ":")),
                "RetryPolicy": {"MaximumRetryAttempts": schedule.max_retries},
                "DeadLetterConfig": {"Arn": self._dlq_arn},
            },
        }
        try:
            self._client.create_schedule(**args)
        except ClientError as exc:
            if _code(exc) != "ResourceNotFoundException":
                raise
            # The dedicated group is missing (the template makes it; a bare account may not).
            self.ensure_group()
            self._client.create_schedule(**args)

    def ensure_group(self) -> None:
        """Create the dedicated schedule group if it does not exist."""
        try:
            self._client.create_schedule_group(Name=self._group)
        except ClientError as exc:
            if _code(exc) != "ConflictException":
                raise _wrap(exc, f"create the group {self._group}") from exc
        except BotoCoreError as exc:
            raise _wrap(exc, f"create the group {self._group}") from exc

    def delete(self, name: str) -> None:
        check_name(name)
        try:
            self._client.delete_schedule(Name=name, GroupName=self._group)
        except ClientError as exc:
            if _code(exc) == "ResourceNotFoundException":
                return
            raise _wrap(exc, f"delete {name}") from exc
        except BotoCoreError as exc:
            raise _wrap(exc, f"delete {name}") from exc

    # -- reading ---------------------------------------------------------------------------
    def get(self, name: str) -> Schedule | None:
        check_name(name)
        try:
            found = self._client.get_schedule(Name=name, GroupName=self._group)
        except ClientError as exc:
            if _code(exc) == "ResourceNotFoundException":
                return None
            raise _wrap(exc, f"get {name}") from exc
        except BotoCoreError as exc:
            raise _wrap(exc, f"get {name}") from exc
        return self._parse(found)

    def _parse(self, found: Mapping[str, Any]) -> Schedule:
        name = str(found["Name"])
        try:
            meta = json.loads(found.get("Description") or "{}")
            expression = str(found["ScheduleExpression"])
            at_local = datetime.fromisoformat(expression[len("at(") : -1])
            timezone = str(found.get("ScheduleExpressionTimezone") or "UTC")
            target = found["Target"]
            data = json.loads(target.get("Input") or "{}")
            payload = {_FROM_INPUT.get(k, k): str(v) for k, v in data.items() if k != _META}
            retries = int(target.get("RetryPolicy", {}).get("MaximumRetryAttempts", 185))
            created = meta.get("created")
            return Schedule(
                name=name,
                group=str(meta.get("group", self._group)),
                at_local=at_local,
                timezone=timezone,
                payload=payload,
                client_token=str(meta.get("token", "")),
                due_at=due_at(at_local, timezone),
                max_retries=retries,
                attempts=0,
                created_at=datetime.fromisoformat(created)
                if created
                else found.get("CreationDate"),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise SchedulerError(f"schedule {name} was not written by sendqueue: {exc}") from exc

    def _names(self, prefix: str | None) -> Iterator[str]:
        """Every schedule name in the dedicated group (with ``prefix``), in AWS's order."""
        args: dict[str, Any] = {"GroupName": self._group, "MaxResults": 100}
        if prefix:
            args["NamePrefix"] = prefix
        try:
            while True:
                page = self._client.list_schedules(**args)
                for summary in page.get("Schedules", []):
                    yield str(summary["Name"])
                token = page.get("NextToken")
                if not token:
                    return
                args["NextToken"] = token
        except ClientError as exc:
            if _code(exc) == "ResourceNotFoundException":
                return  # no group yet: no schedules
            raise _wrap(exc, "list schedules") from exc
        except BotoCoreError as exc:
            raise _wrap(exc, "list schedules") from exc

    def list(self, group: str, *, after: str | None = None, limit: int = 1000) -> list[Schedule]:
        """A page of ``group``'s schedules by name.

        ListSchedules neither sorts nor filters by our group, so the names of the dedicated
        group are listed (narrowed by name prefix where sendqueue's naming gives one: a
        campaign's task schedules start with its group name and a dash), sorted, and the ones
        after ``after`` read one by one until ``limit`` of ``group`` are found.
        """
        check_group(group)
        check_limit(limit)
        prefix = f"{group}-" if group.startswith("sq-") and group != CONTROL_GROUP else None
        names = sorted(n for n in set(self._names(prefix)) if after is None or n > after)
        out: list[Schedule] = []
        for name in names:
            schedule = self.get(name)
            if schedule is not None and schedule.group == group:
                out.append(schedule)
                if len(out) >= limit:
                    break
        return out

    # -- dead letters ----------------------------------------------------------------------
    def _peek(self) -> builtins.list[MessageTypeDef]:
        """Every message in the dead-letter queue, left in it (visible again at once)."""
        seen: dict[str, MessageTypeDef] = {}
        try:
            while True:
                got = self._sqs.receive_message(
                    QueueUrl=self._dlq_url,
                    MaxNumberOfMessages=10,
                    VisibilityTimeout=_PEEK_SECONDS,
                    WaitTimeSeconds=0,
                    AttributeNames=["All"],
                    MessageAttributeNames=["All"],
                ).get("Messages", [])
                fresh = [m for m in got if m["MessageId"] not in seen]
                if not fresh:
                    break
                seen.update((m["MessageId"], m) for m in fresh)
            handles = [m["ReceiptHandle"] for m in seen.values()]
            for start in range(0, len(handles), 10):
                self._sqs.change_message_visibility_batch(
                    QueueUrl=self._dlq_url,
                    Entries=[
                        {"Id": str(i), "ReceiptHandle": h, "VisibilityTimeout": 0}
                        for i, h in enumerate(handles[start : start + 10])
                    ],
                )
        except (ClientError, BotoCoreError) as exc:
            raise _wrap(exc, "read the dead-letter queue") from exc
        return builtins.list(seen.values())

    @staticmethod
    def _letter(message: MessageTypeDef) -> tuple[DeadLetter, str]:
        """The dead letter a DLQ message stands for, and the schedule's time zone."""
        body = json.loads(message.get("Body") or "{}")
        attrs = message.get("MessageAttributes", {})
        sent = int(message.get("Attributes", {}).get("SentTimestamp", "0"))
        if isinstance(body, dict) and "requestPayload" in body:
            # Lambda's on-failure destination record: the function failed every attempt.
            data = body.get("requestPayload") or {}
            response = body.get("responsePayload") or {}
            error = f"{response.get('errorType', 'Error')}: {response.get('errorMessage', '')}"
            attempts = int(body.get("requestContext", {}).get("approximateInvokeCount", 1))
        else:
            # The Scheduler's own dead letter: the event could not be handed to the target.
            data = body if isinstance(body, dict) else {}

            def attr(key: str, default: str) -> str:
                value = attrs.get(key)
                return str(value.get("StringValue", default)) if value else default

            error = f"{attr('ERROR_CODE', 'Error')}: {attr('ERROR_MESSAGE', '')}"
            attempts = int(attr("RETRY_ATTEMPTS", "0")) + 1
        meta = data.get(_META) or {}
        payload = {_FROM_INPUT.get(k, k): str(v) for k, v in data.items() if k != _META}
        letter = DeadLetter(
            id=message["MessageId"],
            schedule_name=str(meta.get("schedule", "")),
            group=str(meta.get("group", "")),
            payload=payload,
            error=error,
            attempts=attempts,
            failed_at=datetime.fromtimestamp(sent / 1000, UTC),
        )
        return letter, str(meta.get("tz", "UTC"))

    def dead_letters(self, *, limit: int = 1000) -> builtins.list[DeadLetter]:
        letters = [self._letter(m)[0] for m in self._peek()]
        return sorted(letters, key=lambda letter: (letter.failed_at, letter.id))[:limit]

    def dead_letter(self, dead_letter_id: str) -> DeadLetter | None:
        for message in self._peek():
            if message["MessageId"] == dead_letter_id:
                return self._letter(message)[0]
        return None

    def redrive(self, dead_letter_id: str) -> Schedule:
        """Re-create the letter's schedule due now (a new token), then delete the message.

        If the schedule exists again (the reconciler recreated it), it is kept as it is.
        """
        for message in self._peek():
            if message["MessageId"] != dead_letter_id:
                continue
            letter, zone = self._letter(message)
            if not letter.schedule_name:
                raise SchedulerError(f"dead letter {dead_letter_id} names no schedule")
            existing = self.get(letter.schedule_name)
            schedule = existing or self.create(
                letter.schedule_name,
                letter.group,
                local_now(self._clock.now(), zone),
                zone,
                letter.payload,
                new_token(),
            )
            try:
                # Peeking did not receive it again, so its receipt handle is still current.
                self._sqs.delete_message(
                    QueueUrl=self._dlq_url, ReceiptHandle=message["ReceiptHandle"]
                )
            except (ClientError, BotoCoreError) as exc:
                raise _wrap(exc, f"delete the dead letter {dead_letter_id}") from exc
            return schedule
        raise NotFound("dead letter", dead_letter_id)

    def close(self) -> None:
        self._client.close()
        self._sqs.close()
