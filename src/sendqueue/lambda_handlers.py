"""The AWS Lambda entry points: ``send_handler``, ``provision_handler``, ``reconcile_handler``,
``alarm_handler``, ``feedback_handler`` and ``webhooks_handler``.

All five go through the same composition root: the first invocation in a Lambda execution
environment builds one :class:`~sendqueue.bootstrap.Container` from the environment
(``SENDQUEUE_*``, see docs/settings.md) and every later invocation in that warm environment reuses
it, with its boto3 clients and connections. The send function's settings are
:class:`~sendqueue.settings.LambdaSettings`: production needs no API token in a function, but
it does need the public URL and the secret key of the unsubscribe links its emails carry (the
key read from Secrets Manager at the cold start). The other functions send no campaign email
and use :class:`~sendqueue.settings.LambdaControlSettings`, which need neither.

Events:

- **send** (the target of every task's EventBridge schedule): the schedule's ``Input``,
  ``{"taskId": ..., "token": ..., "kind": "send", "sendqueue": {...}}`` as
  :class:`~sendqueue.adapters.eventbridge.scheduler.EventBridgeScheduler` writes it; only
  ``taskId`` is required (without ``token`` the worker does not check it). The worker's rules
  hold: a task that is not Pending, a stale token or a duplicate invocation is skipped and the
  handler returns normally; it raises only when infrastructure fails (the store is unreachable),
  so Lambda's asynchronous retries and on-failure destination (the dead-letter queue) apply.
  A control schedule (``"kind": "provision"``, a provisioning continuation written by a process
  with a time budget) is handled like a provision event within this function's time.
- **provision**: ``{"campaignId": ..., "checkpoint": {...}?}``. Provisions with at most
  ``SENDQUEUE_PROVISION_CONCURRENCY`` (default 10) Scheduler calls in flight, asks the context
  for the time left before every chunk, and stops 90 s (``provision_margin``) before the
  function's timeout: the checkpoint is saved in the store, the lease released, and the function
  invokes itself asynchronously (``InvocationType="Event"``) with the campaign id and that
  checkpoint. The stored checkpoint is the one a run resumes from; the event's is informational
  (it is logged). A run that stopped because schedule writes failed raises, so Lambda retries it
  from the checkpoint.
- **reconcile**: any event (the template's 30-minute schedule); one reconciler pass. A stuck
  provisioning run the pass resumes gets the same time budget as in the provision function: it
  stops 90 s before this function's timeout with the checkpoint saved and invokes the provision
  function (``SENDQUEUE_PROVISION_FUNCTION_ARN``) asynchronously to continue; without that
  setting the rest is handed to a control schedule (the send function continues it).
- **alarm** (subscribed to the template's SNS alarm topic when ``AlarmWebhook`` is set): every
  SNS record (a CloudWatch alarm's state change: dead letters, failing functions, auto-pauses)
  is POSTed to ``SENDQUEUE_ALARM_WEBHOOK`` as ``{"event": "aws_alarm", ...}`` (see
  :func:`alarm_document`). A POST that fails raises, so Lambda retries the SNS delivery.
- **feedback** (the SQS event source of the template's feedback queue, which SES's bounce and
  complaint events reach through SNS): each record's body is parsed
  (:func:`~sendqueue.domain.ses_events.feedback_from_ses`, raw or in SNS's envelope) and every
  bounce or complaint in it applied by the feedback service (outcome, suppression, the
  address's Pending emails cancelled). A record that is no SES bounce or complaint is logged
  and dropped. A record whose processing fails (the store or the Scheduler unreachable) is
  named in ``batchItemFailures``, so SQS delivers only it again and, after the queue's
  ``maxReceiveCount``, moves it to the feedback dead-letter queue; applying feedback twice has
  the effect of once.
- **webhooks**: any event (the template's one-minute schedule); first relays the SQS
  dead-letter queue's letters into the change log
  (:class:`~sendqueue.services.webhooks.DeadLetterRelay`, once per letter id: on AWS no process
  sees a send fail for good, so this is where ``dead_letter`` events are made), then delivers
  webhook events (:class:`~sendqueue.services.webhooks.WebhookDelivery` passes, each endpoint
  under its store lease, each relaying again every SENDQUEUE_DEAD_LETTER_RELAY_INTERVAL) for
  :data:`WEBHOOK_RUN_SECONDS`, or until 15 s before the timeout, then returns: a pass still
  posting then stops before its next event and saves each endpoint's place, and the next run
  continues from each endpoint's cursor. A pass that fails is logged and the next one tries
  again; the invocation fails only when its last pass did (Lambda's retries, then the
  webhooks dead-letter queue).

Each handler returns a small JSON-friendly summary (the feedback handler: SQS's partial batch
response).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from sendqueue.bootstrap import Container, bootstrap, settle_heap
from sendqueue.domain.errors import InvalidField, InvalidSettings, SchedulerError
from sendqueue.domain.ses_events import feedback_from_ses, ses_event_of
from sendqueue.services.scheduling.provisioning import Continuation, ProvisionReport
from sendqueue.settings import LambdaControlSettings, LambdaSettings, load_settings

__all__ = [
    "WEBHOOK_RUN_SECONDS",
    "LambdaContext",
    "alarm_document",
    "alarm_handler",
    "container",
    "feedback_handler",
    "provision_handler",
    "reconcile_handler",
    "send_handler",
    "use",
    "webhooks_handler",
]

log = logging.getLogger(__name__)


class LambdaContext(Protocol):
    """The parts of Lambda's context object the handlers use."""

    @property
    def invoked_function_arn(self) -> str: ...

    def get_remaining_time_in_millis(self) -> int: ...


#: ``invoke(FunctionName=..., InvocationType="Event", Payload=...)``: boto3's Lambda client
#: method, or a stand-in that records the call.
Invoke = Callable[..., Any]

_lock = threading.Lock()
_state: dict[str, Any] = {}


def use(built: Container | None = None, *, invoke: Invoke | None = None) -> None:
    """Install the container (and the Lambda ``invoke`` call) the handlers use, instead of
    building them from the environment at first use; ``use()`` forgets both."""
    with _lock:
        _state.clear()
        if built is not None:
            _state["container"] = built
        if invoke is not None:
            _state["invoke"] = invoke


def container(settings: type[LambdaSettings] = LambdaSettings) -> Container:
    """This execution environment's container, built from the environment at first use with
    ``settings``: :class:`LambdaSettings` for the send function, :class:`LambdaControlSettings`
    for the others (an execution environment runs one function, so the first call decides).

    Refused settings are logged at ERROR, one line per problem naming its variable, and raised
    as :class:`InvalidSettings` (every invocation fails the same way until they are fixed)."""
    with _lock:
        built = _state.get("container")
        if built is None:
            logging.getLogger("sendqueue").setLevel(logging.INFO)
            try:
                loaded = load_settings(settings)
            except InvalidSettings as exc:
                for problem in exc.problems:
                    log.error("invalid settings: %s", problem)
                raise
            built = _state["container"] = bootstrap(loaded)
            settle_heap()
        return built


def _invoke(function_arn: str) -> Invoke:
    with _lock:
        invoke = _state.get("invoke")
        if invoke is None:
            import boto3  # the aws extra; Lambda's Python runtime has it

            region = function_arn.split(":")[3] if function_arn.count(":") >= 6 else None
            invoke = _state["invoke"] = boto3.client("lambda", region_name=region).invoke
        return invoke


def _time_left(context: LambdaContext) -> Callable[[], float]:
    """Seconds left before the function's timeout, asked afresh at every call."""
    return lambda: context.get_remaining_time_in_millis() / 1000.0


def _text(event: Mapping[str, Any], key: str) -> str:
    value = event.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidField(key, value, "the event needs it as a non-empty string")
    return value


def _event(event: object) -> Mapping[str, Any]:
    if isinstance(event, str | bytes):  # a test console or a raw payload
        try:
            event = json.loads(event)
        except ValueError as exc:
            raise InvalidField("event", event, f"not JSON: {exc}") from None
    if not isinstance(event, Mapping):
        raise InvalidField("event", event, "expected a JSON object")
    return event


# -- send ----------------------------------------------------------------------------------
def send_handler(event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
    """One schedule fired: hand the task to the send worker (see the module docstring)."""
    try:
        data = _event(event)
        kind = data.get("kind", "send")
        if kind not in {"send", "provision"}:
            raise InvalidField("kind", kind, "expected send or provision")
        key = "taskId" if kind == "send" else "campaignId"
        wanted = _text(data, key)
    except InvalidField as exc:
        # Retrying a malformed event cannot help; an ERROR log (which can be alarmed on) can.
        log.error("send: malformed event, ignored: %s", exc)
        return {"status": "rejected", "error": str(exc)}
    c = container()  # the send function's settings, whatever the first event
    if kind == "provision":
        return _provision(c, wanted, context, continuation=None)
    task_id = wanted
    payload = {"kind": "send", "task_id": task_id}
    token = data.get("token")
    if isinstance(token, str):
        payload["token"] = token
    c.worker.send(payload)  # raises only on infrastructure failure
    return {"status": "handled", "taskId": task_id}


# -- provision -----------------------------------------------------------------------------
def provision_handler(event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Provision a campaign within this invocation's time; continue in a new one."""
    data = _event(event)
    campaign_id = _text(data, "campaignId")
    checkpoint = data.get("checkpoint")
    if checkpoint is not None:
        log.info("provision %s: continuing (checkpoint %s)", campaign_id, checkpoint)
    return _provision(
        container(LambdaControlSettings),
        campaign_id,
        context,
        continuation=_continue_in(context.invoked_function_arn),
    )


def _continue_in(function_arn: str) -> Continuation:
    """Hands a provisioning run on to the provision function: an asynchronous invocation with
    the campaign id and the saved checkpoint."""

    def continue_in_lambda(cid: str, saved: dict[str, object]) -> None:
        body = json.dumps({"campaignId": cid, "checkpoint": saved}, separators=(",", ":"))
        _invoke(function_arn)(
            FunctionName=function_arn, InvocationType="Event", Payload=body.encode()
        )

    return continue_in_lambda


def _provision(
    c: Container,
    campaign_id: str,
    context: LambdaContext,
    *,
    continuation: Continuation | None,
) -> dict[str, Any]:
    margin = c.config.provision_margin
    left = context.get_remaining_time_in_millis() / 1000.0
    if left <= margin:
        # Continuing now would hand the same nothing on, forever: a configuration error.
        raise InvalidField(
            "Timeout",
            round(left),
            f"the function needs more than {margin:g} s to provision (set its timeout to 900)",
        )
    report = c.provisioner.provision(
        campaign_id,
        time_left=_time_left(context),
        safety_margin=margin,
        continuation=continuation,
    )
    summary = _summary(report)
    log.info("provision %s: %s", campaign_id, summary)
    if report.status == "stopped":
        # Schedule writes failed (the Scheduler is down or refusing): let Lambda retry it.
        raise SchedulerError(
            f"provisioning {campaign_id} stopped with the checkpoint kept: {report.errors[:3]}"
        )
    return summary


def _summary(report: ProvisionReport) -> dict[str, Any]:
    return {
        "campaignId": report.campaign_id,
        "status": report.status,
        "total": report.total,
        "tasksCreated": report.tasks_created,
        "schedulesCreated": report.schedules_created,
        "throttled": report.throttled,
        "suppressed": report.suppressed,
        "errors": report.errors[:20],
        "seconds": round(report.seconds, 3),
    }


# -- reconcile -----------------------------------------------------------------------------
def reconcile_handler(event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
    """One reconciler pass (the template runs it every 30 minutes); a provisioning run it
    resumes stops 90 s before the timeout and continues in the provision function."""
    c = container(LambdaControlSettings)
    target = c.settings.provision_function_arn
    report = c.reconciler.run(
        time_left=_time_left(context),
        continuation=_continue_in(target) if target else None,
    )
    return report.as_dict()


# -- alarm ---------------------------------------------------------------------------------
def alarm_document(sns: Mapping[str, Any]) -> dict[str, Any]:
    """The webhook's JSON for one SNS notification (the ``Sns`` part of a Lambda record).

    A CloudWatch alarm's message is JSON; its name, state, reason and description are lifted
    into ``alarm``. Any other message is passed on as text, with ``alarm`` null.
    """
    message = sns.get("Message")
    text = message if isinstance(message, str) else json.dumps(message)
    alarm: dict[str, Any] | None = None
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, Mapping) and "AlarmName" in parsed:
        alarm = {
            "name": parsed.get("AlarmName"),
            "state": parsed.get("NewStateValue"),
            "previous_state": parsed.get("OldStateValue"),
            "reason": parsed.get("NewStateReason"),
            "description": parsed.get("AlarmDescription"),
            "changed_at": parsed.get("StateChangeTime"),
        }
    return {
        "event": "aws_alarm",
        "id": sns.get("MessageId"),
        "topic": sns.get("TopicArn"),
        "subject": sns.get("Subject"),
        "at": sns.get("Timestamp"),
        "alarm": alarm,
        "message": text,
    }


def alarm_handler(event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Relay the SNS alarm topic's notifications to SENDQUEUE_ALARM_WEBHOOK (see the module
    docstring). A function rather than an SNS HTTPS subscription: such a subscription stays
    pending until the endpoint visits its confirmation URL, which a chat or paging webhook
    does not do, and it would POST SNS's envelope instead of sendqueue's alarm document."""
    data = _event(event)
    records = data.get("Records")
    if not isinstance(records, list):
        raise InvalidField("Records", records, "expected the SNS event's list of records")
    c = container(LambdaControlSettings)
    posted = 0
    for record in records:
        sns = record.get("Sns") if isinstance(record, Mapping) else None
        if not isinstance(sns, Mapping):
            log.error("alarm: a record without an SNS notification, ignored: %s", record)
            continue
        document = alarm_document(sns)
        # Raises when the POST fails: Lambda retries the whole event (a duplicate POST is
        # better than an alarm nobody hears).
        if not c.post_to_alarm_webhook(document):
            log.error(
                "alarm: SENDQUEUE_ALARM_WEBHOOK is not set; notification %s dropped", document["id"]
            )
            continue
        posted += 1
        log.info("alarm: notification %s posted to the webhook", document["id"])
    return {"status": "handled", "posted": posted}


# -- feedback ------------------------------------------------------------------------------
def feedback_handler(event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Apply the SES bounces and complaints of an SQS batch (see the module docstring).

    Returns SQS's partial batch response, ``{"batchItemFailures": [{"itemIdentifier": id}]}``
    (the event source mapping's ``ReportBatchItemFailures``): the records named are delivered
    again, the others are deleted from the queue.
    """
    data = _event(event)
    records = data.get("Records")
    if not isinstance(records, list):
        raise InvalidField("Records", records, "expected the SQS event's list of records")
    c = container(LambdaControlSettings)
    failures: list[dict[str, str]] = []
    counts: Counter[str] = Counter()
    for record in records:
        record = record if isinstance(record, Mapping) else {}
        message_id = record.get("messageId")
        document = ses_event_of(record.get("body"))
        if document is None:
            # Retrying cannot make it readable; an ERROR log (which can be alarmed on) is seen.
            log.error("feedback: record %s is no SES bounce or complaint, dropped", message_id)
            counts["dropped"] += 1
            continue
        try:
            for item in feedback_from_ses(document, received_at=c.clock.now()):
                applied = c.feedback.apply(item)
                counts["ignored" if applied.ignored else "applied"] += 1
                log.info(
                    "feedback: %s %s task %s: outcome %s, suppressed %s, %d cancelled%s",
                    message_id, item.kind.value, applied.task_id, applied.outcome_set,
                    applied.suppressed, len(applied.cancelled),
                    f" (ignored: {applied.ignored})" if applied.ignored else "",
                )  # fmt: skip
        except Exception:  # the store or the Scheduler failed: SQS retries, then dead-letters
            if not isinstance(message_id, str) or not message_id:
                raise  # a record SQS cannot be told about: the whole batch comes again
            log.exception("feedback: record %s failed, SQS delivers it again", message_id)
            failures.append({"itemIdentifier": message_id})
    log.info("feedback: %d records, %s, %d failed", len(records), dict(counts), len(failures))
    return {"batchItemFailures": failures}


# -- webhooks ------------------------------------------------------------------------------
#: How long one webhooks invocation delivers (its schedule runs it every minute).
WEBHOOK_RUN_SECONDS = 50.0


def webhooks_handler(event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Deliver webhook events for about a minute (see the module docstring)."""
    c = container(LambdaControlSettings)
    left = _time_left(context)
    try:
        c.dead_letter_relay.run(force=True)
    except Exception:  # the passes below relay again; delivering goes on meanwhile
        log.exception("webhooks: relaying the dead letters failed")
    delivery = c.webhook_delivery
    wait = c.settings.webhook_poll_interval
    totals: Counter[str] = Counter()
    run = min(WEBHOOK_RUN_SECONDS, max(0.0, left() - 15.0))
    deadline = time.monotonic() + run
    # Stops a pass between two events: a long batch to a slow receiver would otherwise run
    # into the timeout before its endpoint's cursor is saved, and the next run repeat it.
    stop = threading.Event()
    timer = threading.Timer(run, stop.set)
    timer.daemon = True
    timer.start()
    failed: Exception | None = None
    try:
        while True:
            try:
                report = delivery.run_pass(stop)
            except Exception as exc:  # the next pass tries again; the last one's failure raises
                log.exception("webhooks: a delivery pass failed")
                failed, full = exc, False
            else:
                failed, full = None, report.full
                totals.update(
                    delivered=report.delivered, failed=report.failed, disabled=report.disabled
                )
            if stop.is_set() or time.monotonic() >= deadline:
                break
            if not full:
                stop.wait(min(wait, max(0.0, deadline - time.monotonic())))
    finally:
        timer.cancel()
    if failed is not None:
        raise failed
    return {"status": "handled", **{k: totals[k] for k in ("delivered", "failed", "disabled")}}
