"""The Lambda handlers on moto: DynamoDB, EventBridge Scheduler (played), SQS and SES.

moto keeps the schedules; :class:`~tests.support.eventbridge_player.EventBridgePlayer` fires
them at the send handler as EventBridge and Lambda would, duplicates and failures included.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pytest

from sendqueue import lambda_handlers
from sendqueue.adapters.dynamodb.store import DynamoDbTaskStore
from sendqueue.adapters.eventbridge.scheduler import EventBridgeScheduler
from sendqueue.adapters.mail.ses import SesMailer
from sendqueue.bootstrap import Container, bootstrap
from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import CONTROL_GROUP, expected_schedule_name, schedule_group
from sendqueue.domain.webhooks import event_id, event_of
from sendqueue.ports import Schedule
from sendqueue.ports.webhooks import WebhookResponse
from sendqueue.services.webhooks import WebhookDelivery
from sendqueue.settings import Settings
from sendqueue.testing.clock import FakeClock
from tests.aws.test_ses_mailer import sent_messages
from tests.support.app import T0, csv_bytes, open_policy
from tests.support.aws import (
    REGION,
    SCHEDULE_GROUP,
    AwsWorld,
    client,
    dynamodb_url,
    eventbridge,
    world,
)
from tests.support.eventbridge_player import EventBridgePlayer, FakeContext
from tests.unit.test_webhooks import Receiver

TABLE = "sendqueue"
PROVISION_ARN = f"arn:aws:lambda:{REGION}:123456789012:function:sendqueue-provision"
RECONCILE_ARN = f"arn:aws:lambda:{REGION}:123456789012:function:sendqueue-reconcile"


class CountingScheduler:
    """The EventBridge adapter, counting the ``create`` calls in flight at once."""

    def __init__(self, inner: EventBridgeScheduler) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0
        self.creates = 0

    def create(self, *args: Any, **kwargs: Any) -> Schedule:
        with self._lock:
            self.in_flight += 1
            self.creates += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return self._inner.create(*args, **kwargs)
        finally:
            with self._lock:
                self.in_flight -= 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@dataclass
class Aws:
    app: Container
    made: AwsWorld
    clock: FakeClock
    scheduler: CountingScheduler
    invocations: list[dict[str, Any]]

    def create_campaign(self, count: int) -> str:
        return self.app.campaign_import.create(
            name="aws", recipients=csv_bytes(count), policy=open_policy()
        ).campaign.id

    def send_context(self) -> FakeContext:
        return FakeContext(self.made.send_arn, 300_000)  # the template's send timeout

    def player(self, **kwargs: Any) -> EventBridgePlayer:
        return EventBridgePlayer(
            client("scheduler"),
            client("sqs"),
            group=SCHEDULE_GROUP,
            dead_letter_url=self.made.dlq_url,
            handler=lambda_handlers.send_handler,
            clock=self.clock,
            context=self.send_context,
            **kwargs,
        )

    def raw_schedules(self) -> dict[str, dict[str, Any]]:
        raw = client("scheduler")
        names = [
            s["Name"]
            for s in raw.list_schedules(GroupName=SCHEDULE_GROUP, MaxResults=100)["Schedules"]
        ]
        return {n: raw.get_schedule(Name=n, GroupName=SCHEDULE_GROUP) for n in names}


def _settings(made: AwsWorld, **extra: Any) -> Settings:
    values: dict[str, Any] = {
        "_env_file": None,
        "execution": "eventbridge",
        "database_url": f"dynamodb://{TABLE}?region={REGION}",
        "schedule_group": SCHEDULE_GROUP,
        "send_function_arn": made.send_arn,
        "provision_function_arn": PROVISION_ARN,
        "scheduler_role_arn": made.role_arn,
        "dead_letter_queue_url": made.dlq_url,
        "dead_letter_queue_arn": made.dlq_arn,
        "mailer": f"ses:{REGION}",
        "default_from": "news@example.com",
        "retry_backoff": 60.0,
    }
    values.update(extra)
    return Settings(**values)


@pytest.fixture
def aws() -> Iterator[Aws]:
    made = world()
    client("sesv2").create_email_identity(EmailIdentity="example.com")
    clock = FakeClock(T0)
    scheduler = CountingScheduler(eventbridge(clock, made))
    app = bootstrap(
        _settings(made),
        clock=clock,
        # moto's one-request-at-a-time endpoint: concurrent claims are atomic, as on DynamoDB
        store=DynamoDbTaskStore(client("dynamodb", url=dynamodb_url()), TABLE, create_table=True),
        scheduler=scheduler,
        mailer=SesMailer(client("sesv2")),
    )
    # Small chunks, so that a run of a few dozen emails is many chunks (many checkpoints).
    app.config = replace(app.config, provision_chunk=10)
    invocations: list[dict[str, Any]] = []
    lambda_handlers.use(app, invoke=lambda **kw: invocations.append(kw))
    yield Aws(app, made, clock, scheduler, invocations)
    lambda_handlers.use()
    app.close()


def _fire_until_done(aws: Aws, player: EventBridgePlayer, minutes: int) -> list[Any]:
    reports = []
    for _ in range(minutes):
        aws.clock.advance(minutes=1)
        reports.append(player.fire_due())
    return reports


def _messages_by_task() -> Counter[str]:
    found: Counter[str] = Counter()
    for message in sent_messages():
        match = re.search(r"^X-Sendqueue-Task: (\S+)", str(message["raw_data"]), re.MULTILINE)
        assert match, message
        found[match.group(1)] += 1
    return found


def test_provision_fire_send_every_task_finished_with_exactly_one_message(aws: Aws) -> None:
    count = 24
    cid = aws.create_campaign(count)
    summary = lambda_handlers.provision_handler(
        {"campaignId": cid}, FakeContext(PROVISION_ARN, 900_000)
    )
    assert (summary["status"], summary["tasksCreated"], summary["schedulesCreated"]) == (
        "done", count, count,
    )  # fmt: skip
    assert aws.invocations == []  # it had time enough: no continuation
    assert len(aws.raw_schedules()) == count

    tasks = aws.app.store.list_tasks(cid, limit=100)
    # EventBridge delivers twice, fails to hand over once, and the function times out after
    # sending: none of it may send an email twice. One schedule never gets through (the DLQ).
    # Sends are 8.64 s apart, so most lie inside a minute: all but positions 4, 14 fire at the
    # start of their minute (AWS fires anywhere in it), up to 59 s before their send time.
    doomed = expected_schedule_name(tasks[7])
    outage = {doomed}  # until the redrive below, its hand-over always fails
    player = aws.player(
        early=lambda name: not name.endswith("4.0"),
        duplicate=lambda name: name.endswith(("1.0", "5.0")),
        handoff_fails=lambda name, attempt: (
            name in outage or (name.endswith("2.0") and not attempt)
        ),
        fails_after=lambda name, attempt: name.endswith("3.0") and attempt == 0,
    )
    reports = _fire_until_done(aws, player, minutes=6)
    # positions 1, 5, 11, 15, 21 twice; 2, 12, 22 handed over at the second try, the doomed
    # one never (3 tries); 3, 13, 23 failed once after the handler ran
    assert [e for r in reports for e in r.errors if "Sandbox.Timedout" not in e] == []
    assert sum(r.duplicates for r in reports) == 5
    assert sum(r.handoff_failures for r in reports) == 3 + 3
    assert sum(r.function_failures for r in reports) == 3
    assert [n for r in reports for n in r.dead_lettered] == [doomed]
    assert aws.raw_schedules() == {}

    # The dead letter is in the queue; redriving it schedules the task again, now.
    [letter] = aws.app.scheduler.dead_letters()
    assert letter.schedule_name == doomed
    assert aws.app.store.get_task(tasks[7].id).state is TaskState.PENDING  # type: ignore[union-attr]
    outage.clear()
    aws.app.scheduler.redrive(letter.id)
    assert _fire_until_done(aws, player, minutes=1)[0].fired == [doomed]
    assert aws.app.scheduler.dead_letters() == []
    # minutes past its send time (SENDQUEUE_MAX_LATENESS: 300 s), it is not sent late but
    # moved to the next free slot, and goes out there
    moved = aws.app.store.get_task(tasks[7].id)
    assert moved is not None and moved.state is TaskState.PENDING
    # Lambda ran throughout; the schedule's hand-overs failed until the redrive: fired late
    assert moved.moves == 1 and (moved.moved_reason or "").startswith("fired late ")
    assert [n for r in _fire_until_done(aws, player, minutes=2) for n in r.fired] == [doomed]

    final = aws.app.store.list_tasks(cid, limit=100)
    assert Counter(t.state for t in final) == {TaskState.FINISHED: count}
    assert _messages_by_task() == Counter({t.id: 1 for t in tasks})
    # Fired early within their minute, sent then; never before the minute of the send time.
    sent = {t.id: t.sent_at for t in final if t.sent_at is not None}
    assert sum(sent[t.id] < t.send_at for t in tasks) >= count // 2
    assert all(sent[t.id] >= t.send_at.replace(second=0, microsecond=0) for t in tasks)
    assert aws.app.store.get_campaign(cid).state is CampaignState.COMPLETED


def test_a_suppressed_address_is_never_sent_on_dynamodb_and_lambda(aws: Aws) -> None:
    aws.app.suppression.add("USER2@example.com", "bounced")  # before provisioning
    cid = aws.create_campaign(12)
    summary = lambda_handlers.provision_handler(
        {"campaignId": cid}, FakeContext(PROVISION_ARN, 900_000)
    )
    assert (summary["status"], summary["schedulesCreated"], summary["suppressed"]) == (
        "done", 11, 1,
    )  # fmt: skip
    aws.app.suppression.add("user9@example.com", "unsubscribed")  # after provisioning
    _fire_until_done(aws, aws.player(), minutes=3)

    assert _messages_by_task() == Counter({f"{cid}-{i}": 1 for i in range(12) if i not in (2, 9)})
    tasks = {t.email: t for t in aws.app.store.list_tasks(cid, limit=100)}
    assert (tasks["user2@example.com"].state, tasks["user2@example.com"].reason) == (
        TaskState.CANCELLED, "suppressed: bounced",
    )  # fmt: skip
    assert (tasks["user9@example.com"].state, tasks["user9@example.com"].reason) == (
        TaskState.CANCELLED, "suppressed: unsubscribed",
    )  # fmt: skip
    assert aws.app.suppressions.count_suppressed_tasks(cid) == 2


def test_provisioning_with_100_s_left_checkpoints_and_continues_in_a_new_invocation(
    aws: Aws,
) -> None:
    count = 60
    cid = aws.create_campaign(count)
    # 100 s left, and every question about the time spends 3 s of it: 97, 94, 91, then 88 is
    # within the 90 s margin. Three chunks of ten tasks are made before it stops.
    context = FakeContext(PROVISION_ARN, 100_000, spend_ms=3_000)
    first = lambda_handlers.provision_handler({"campaignId": cid}, context)
    assert (first["status"], first["tasksCreated"]) == ("continued", 30)
    campaign = aws.app.store.get_campaign(cid)
    assert campaign.state is CampaignState.PROVISIONING
    assert campaign.checkpoint is not None
    assert (campaign.checkpoint["phase"], campaign.checkpoint["after"]) == ("tasks", 29)

    [call] = aws.invocations
    assert call["FunctionName"] == PROVISION_ARN
    assert call["InvocationType"] == "Event"
    payload = json.loads(call["Payload"])
    assert payload == {"campaignId": cid, "checkpoint": campaign.checkpoint}
    # Not through a control schedule: the provision function continues itself.
    assert aws.app.scheduler.list(CONTROL_GROUP) == []

    # The continuation, then the same continuation again (Lambda's async delivery is
    # at-least-once): the job completes once.
    done = lambda_handlers.provision_handler(payload, FakeContext(PROVISION_ARN, 900_000))
    assert (done["status"], done["tasksCreated"]) == ("done", 30)
    assert first["schedulesCreated"] + done["schedulesCreated"] == count
    again = lambda_handlers.provision_handler(payload, FakeContext(PROVISION_ARN, 900_000))
    assert (again["status"], again["tasksCreated"], again["schedulesCreated"]) == ("done", 0, 0)
    assert len(aws.invocations) == 1

    tasks = aws.app.store.list_tasks(cid, limit=100)
    assert [t.position for t in tasks] == list(range(count))
    raw = aws.raw_schedules()
    assert sorted(raw) == sorted(expected_schedule_name(t) for t in tasks)
    for task in tasks:
        found = raw[expected_schedule_name(task)]
        assert json.loads(found["Description"])["token"] == task.token
    assert aws.app.store.get_campaign(cid).state is CampaignState.ACTIVE
    assert 1 <= aws.scheduler.most_in_flight <= 10
    assert aws.scheduler.creates == count


def test_a_control_schedule_continues_provisioning_in_the_send_function(aws: Aws) -> None:
    """A process with a time budget (the CLI's --time-budget, the web UI) hands the rest to the
    execution layer; under EventBridge that schedule invokes the send function."""
    cid = aws.create_campaign(15)
    report = aws.app.provisioner.provision(cid, time_budget=1e-9, safety_margin=0)
    assert report.status == "continued"
    [control] = aws.app.scheduler.list(CONTROL_GROUP)
    assert dict(control.payload) == {"kind": "provision", "campaign_id": cid}
    raw = aws.raw_schedules()[control.name]
    assert json.loads(raw["Target"]["Input"])["campaignId"] == cid
    assert raw["Target"]["Arn"] == aws.made.send_arn

    fired = aws.player().fire_due()  # due now
    assert (fired.fired, fired.errors) == ([control.name], [])
    assert aws.app.store.get_campaign(cid).state is CampaignState.ACTIVE
    tasks = aws.app.store.list_tasks(cid, limit=100)
    assert sorted(aws.raw_schedules()) == sorted(expected_schedule_name(t) for t in tasks)
    assert len(tasks) == 15
    assert aws.invocations == []


def test_a_reconcile_recreates_schedules_deleted_behind_its_back_with_the_same_tokens(
    aws: Aws,
) -> None:
    cid = aws.create_campaign(12)
    lambda_handlers.provision_handler({"campaignId": cid}, FakeContext(PROVISION_ARN, 900_000))
    before = aws.raw_schedules()
    raw = client("scheduler")
    gone = sorted(before)[::3]
    for name in gone:
        raw.delete_schedule(Name=name, GroupName=SCHEDULE_GROUP)

    report = lambda_handlers.reconcile_handler({}, FakeContext(PROVISION_ARN, 900_000))
    assert report["ran"] is True
    assert report["missing_schedules_created"] == len(gone)
    after = aws.raw_schedules()
    assert sorted(after) == sorted(before)
    tokens = {t.id: t.token for t in aws.app.store.list_tasks(cid, limit=100)}
    for name in gone:
        data = json.loads(after[name]["Target"]["Input"])
        assert json.loads(after[name]["Description"])["token"] == tokens[data["taskId"]]
        assert data["token"] == tokens[data["taskId"]]
        for key in ("ScheduleExpression", "ScheduleExpressionTimezone", "Target"):
            assert after[name][key] == before[name][key]
    # A second pass finds nothing to repair.
    assert (
        lambda_handlers.reconcile_handler({}, FakeContext(PROVISION_ARN, 900_000))["repairs"] == 0
    )


def _stuck_provisioning(aws: Aws, count: int) -> str:
    """A campaign whose provisioning stopped after 30 tasks and whose continuation was lost."""
    cid = aws.create_campaign(count)
    first = lambda_handlers.provision_handler(
        {"campaignId": cid}, FakeContext(PROVISION_ARN, 100_000, spend_ms=3_000)
    )
    assert (first["status"], first["tasksCreated"]) == ("continued", 30)
    aws.invocations.clear()  # the continuation never ran
    return cid


def test_a_reconcile_resumes_stuck_provisioning_within_its_time_and_hands_the_rest_on(
    aws: Aws,
) -> None:
    count = 90
    cid = _stuck_provisioning(aws, count)
    # The reconcile function has 100 s left, and every question spends 3 s of it: 100, 97, 94,
    # 91 make four more chunks of ten, then 88 is within 90 s of its timeout: it stops there,
    # as the provision function does.
    context = FakeContext(RECONCILE_ARN, 100_000, spend_ms=3_000)
    report = lambda_handlers.reconcile_handler({}, context)
    assert (report["ran"], report["provisioning_resumed"]) == (True, 1)
    campaign = aws.app.store.get_campaign(cid)
    assert campaign.state is CampaignState.PROVISIONING
    assert campaign.checkpoint is not None
    assert (campaign.checkpoint["phase"], campaign.checkpoint["after"]) == ("tasks", 69)
    assert len(aws.app.store.list_tasks(cid, limit=1000)) == 70

    # Handed to the provision function asynchronously, not to the reconcile function itself.
    [call] = aws.invocations
    assert (call["FunctionName"], call["InvocationType"]) == (PROVISION_ARN, "Event")
    payload = json.loads(call["Payload"])
    assert payload == {"campaignId": cid, "checkpoint": campaign.checkpoint}
    assert aws.app.scheduler.list(CONTROL_GROUP) == []

    done = lambda_handlers.provision_handler(payload, FakeContext(PROVISION_ARN, 900_000))
    assert (done["status"], done["tasksCreated"]) == ("done", 20)
    tasks = aws.app.store.list_tasks(cid, limit=1000)
    assert [t.position for t in tasks] == list(range(count))
    assert sorted(aws.raw_schedules()) == sorted(expected_schedule_name(t) for t in tasks)
    assert aws.app.store.get_campaign(cid).state is CampaignState.ACTIVE


def test_a_reconcile_without_the_provision_function_hands_the_rest_to_a_control_schedule(
    aws: Aws,
) -> None:
    cid = _stuck_provisioning(aws, 60)
    aws.app.settings = aws.app.settings.model_copy(update={"provision_function_arn": None})
    report = lambda_handlers.reconcile_handler({}, FakeContext(RECONCILE_ARN, 90_000))
    assert report["provisioning_resumed"] == 1
    assert aws.invocations == []
    [control] = aws.app.scheduler.list(CONTROL_GROUP)
    assert dict(control.payload) == {"kind": "provision", "campaign_id": cid}
    assert len(aws.app.store.list_tasks(cid, limit=1000)) == 30  # no time for a chunk


def test_the_send_handler_maps_the_input_and_skips_a_stale_token(aws: Aws) -> None:
    cid = aws.create_campaign(2)
    lambda_handlers.provision_handler({"campaignId": cid}, FakeContext(PROVISION_ARN, 900_000))
    first, second = aws.app.store.list_tasks(cid, limit=10)
    aws.clock.advance(minutes=5)
    context = aws.send_context()
    stale = lambda_handlers.send_handler({"taskId": first.id, "token": "old"}, context)
    assert stale == {"status": "handled", "taskId": first.id}
    assert aws.app.store.get_task(first.id).state is TaskState.PENDING  # type: ignore[union-attr]
    # Only taskId is required.
    lambda_handlers.send_handler({"taskId": first.id}, context)
    assert aws.app.store.get_task(first.id).state is TaskState.FINISHED  # type: ignore[union-attr]
    bad: Any  # malformed events, some not even a mapping
    for bad, field in (
        ({}, "taskId"), ({"taskId": 7}, "taskId"), ({"kind": "x"}, "kind"), ("{", "event"),
        ({"kind": "provision"}, "campaignId"),
    ):  # fmt: skip
        answer = lambda_handlers.send_handler(bad, context)
        assert answer["status"] == "rejected"
        assert answer["error"].startswith(f"{field}:")
    assert aws.app.store.get_task(second.id).state is TaskState.PENDING  # type: ignore[union-attr]
    assert schedule_group(cid) == f"sq-{cid}"


def test_a_provision_function_without_time_for_its_margin_is_a_clear_error(aws: Aws) -> None:
    cid = aws.create_campaign(3)
    with pytest.raises(Exception, match="Timeout: the function needs more than 90 s"):
        lambda_handlers.provision_handler({"campaignId": cid}, FakeContext(PROVISION_ARN, 60_000))
    assert aws.invocations == []
    assert aws.app.store.get_campaign(cid).state is CampaignState.DRAFT


def test_the_container_is_built_once_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from tests.support.aws import moto_url

    made = world()
    DynamoDbTaskStore(client("dynamodb", url=dynamodb_url()), TABLE, create_table=True).close()
    settings = _settings(
        made, database_url=f"dynamodb://{TABLE}?region={REGION}&endpoint_url={dynamodb_url()}"
    )
    monkeypatch.chdir(tmp_path)  # no .env from the work tree
    for name in settings.model_fields_set - {"_env_file"}:
        monkeypatch.setenv(f"SENDQUEUE_{name.upper()}", str(getattr(settings, name)))
    # boto3's own chain: Lambda's environment gives it credentials and the region
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url())
    lambda_handlers.use()
    try:
        built = lambda_handlers.container()
        assert lambda_handlers.container() is built
        assert isinstance(built.store, DynamoDbTaskStore)
        assert isinstance(built.scheduler, EventBridgeScheduler)
        assert isinstance(built.mailer, SesMailer)
        cid = built.campaign_import.create(
            name="env", recipients=csv_bytes(2), policy=open_policy(start=built.clock.now())
        ).campaign.id
        summary = lambda_handlers.provision_handler(
            {"campaignId": cid}, FakeContext(PROVISION_ARN, 900_000)
        )
        assert summary["schedulesCreated"] == 2
        names = client("scheduler").list_schedules(GroupName=SCHEDULE_GROUP)["Schedules"]
        assert len(names) == 2
        with pytest.raises(Exception, match=r"SENDQUEUE_EXECUTION.*serve --no-worker"):
            built.dispatcher  # noqa: B018
    finally:
        built = lambda_handlers.container()
        lambda_handlers.use()
        built.close()


def test_the_webhooks_function_delivers_the_events_made_since_its_last_run(aws: Aws) -> None:
    receiver = Receiver()
    store: Any = aws.app.store
    aws.app.__dict__["webhook_delivery"] = WebhookDelivery(store, store, receiver, aws.clock)
    endpoint = aws.app.webhooks.add("https://hooks.example.com/in").endpoint
    cid = aws.create_campaign(3)
    lambda_handlers.provision_handler({"campaignId": cid}, FakeContext(PROVISION_ARN, 900_000))
    aws.app.campaign_controls.cancel_task(f"{cid}-1")
    # 15.2 s left: it delivers for 0.2 s (15 s are kept for the rest of the invocation)
    report = lambda_handlers.webhooks_handler({}, FakeContext(PROVISION_ARN, 15_200))
    assert report == {"status": "handled", "delivered": 1, "failed": 0, "disabled": 0}
    assert [b["type"] for _, _, b in receiver.got] == ["email.cancelled"]
    assert aws.app.webhooks.get(endpoint.id).cursor == aws.app.store.last_change_id()
    again = lambda_handlers.webhooks_handler({}, FakeContext(PROVISION_ARN, 15_000))
    assert again["delivered"] == 0 and len(receiver.got) == 1


def test_the_webhooks_function_stops_at_its_deadline_mid_batch_and_keeps_its_place(
    aws: Aws,
) -> None:
    """A run stops posting when its time is up, even in the middle of an endpoint's batch,
    and saves the endpoint's place: the next run goes on from there. (It posted the whole
    batch first, so a slow receiver ran it into the function's timeout before the cursor was
    saved, and every run sent the same events again.)"""

    class SlowReceiver(Receiver):
        def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> WebhookResponse:
            time.sleep(0.1)
            return super().post(url, body, headers)

    receiver = SlowReceiver()
    store: Any = aws.app.store
    aws.app.__dict__["webhook_delivery"] = WebhookDelivery(store, store, receiver, aws.clock)
    endpoint = aws.app.webhooks.add("https://hooks.example.com/in").endpoint
    cid = aws.create_campaign(30)
    lambda_handlers.provision_handler({"campaignId": cid}, FakeContext(PROVISION_ARN, 900_000))
    aws.app.campaign_controls.cancel(cid)
    made = [c for c in store.changes_after(endpoint.cursor, limit=500) if event_of(c)]
    assert len(made) == 30
    # 16 s left: it delivers for 1 s (15 s are kept for the rest of the invocation)
    first = lambda_handlers.webhooks_handler({}, FakeContext(PROVISION_ARN, 16_000))
    delivered = first["delivered"]
    assert delivered < 30
    place = made[delivered - 1].id if delivered else endpoint.cursor
    assert aws.app.webhooks.get(endpoint.id).cursor == place
    for _ in range(10):
        if len(receiver.got) == 30:
            break
        lambda_handlers.webhooks_handler({}, FakeContext(PROVISION_ARN, 16_000))
    assert receiver.ids == [event_id(c.id) for c in made]  # each once, in order
