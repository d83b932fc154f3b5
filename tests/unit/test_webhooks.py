"""Webhooks on the fakes: the events a change log makes, Standard Webhooks signatures (checked
with hmac per the spec and with the ``standardwebhooks`` library), the
endpoints' use cases, and the delivery pass (order, head-of-line blocking, back-off, disable,
redelivery with the same ids)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from sendqueue.domain.errors import (
    InvalidField,
    NotFound,
    PermanentMailError,
    WebhookDeliveryFailed,
)
from sendqueue.domain.lifecycle import CampaignState, TaskOutcome, TaskState
from sendqueue.domain.models import Campaign, ChangeLogEntry, DeadLetter
from sendqueue.domain.webhook_safety import signature_header, signed_headers, verify
from sendqueue.domain.webhooks import (
    DeliveryRecord,
    EventTask,
    EventType,
    backoff,
    event_body,
    event_id,
    event_of,
)
from sendqueue.ports.webhooks import WebhookResponse
from sendqueue.services.webhooks import DeliveryPolicy, WebhookDelivery, WebhookService
from sendqueue.services.webhooks.dead_letters import DeadLetterLog, DeadLetterRelay
from sendqueue.testing.alarm import RecordingAlarm
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.mailer import RecordingMailer
from sendqueue.testing.scheduler import FakeScheduler
from sendqueue.testing.store import InMemoryTaskStore
from sendqueue.testing.tasks import bare_task
from tests.support.app import T0, csv_bytes, fake_app, open_policy

CID = "c00000000000a"


class Receiver:
    """A WebhookTransport that records what it got and fails while ``down``."""

    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, str], dict[str, object]]] = []
        self.down = False

    def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> WebhookResponse:
        if self.down:
            raise WebhookDeliveryFailed("HTTP 503 (not 2xx)", status=503)
        self.got.append((url, dict(headers), json.loads(body)))
        return WebhookResponse(200, 1)

    @property
    def ids(self) -> list[str]:
        return [h["webhook-id"] for _, h, _ in self.got]


class Alarm:
    def __init__(self) -> None:
        self.disabled: list[tuple[str, str]] = []

    def webhook_disabled(self, endpoint_id: str, url: str, reason: str) -> None:
        self.disabled.append((endpoint_id, reason))


class World:
    def __init__(self) -> None:
        self.clock = FakeClock(T0)
        self.store = InMemoryTaskStore()
        self.receiver = Receiver()
        self.alarm = Alarm()
        self.delivery = WebhookDelivery(
            self.store,
            self.store,
            self.receiver,
            self.clock,
            alarm=self.alarm,
            policy=DeliveryPolicy(retry_base=5, retry_cap=60, give_up_after=600),
        )
        self.service = WebhookService(
            self.store, self.store, self.clock, self.delivery, production=False
        )
        campaign = Campaign(
            id=CID,
            name="c",
            policy=open_policy(),
            from_addr="a@example.com",
            state=CampaignState.ACTIVE,
        )
        self.store.create_campaign(campaign, [])

    def send(self, position: int) -> None:
        task = bare_task(CID, position, T0)
        self.store.insert_tasks([task], at=T0)
        self.store.transition(task.id, TaskState.PENDING, TaskState.RUNNING, at=T0)
        self.store.transition(
            task.id,
            TaskState.RUNNING,
            TaskState.FINISHED,
            at=T0,
            changes={"sent_at": T0, "message_id": f"<m{position}@x>"},
        )


@pytest.fixture
def world() -> World:
    return World()


def entry(
    to: str, *, frm: str | None = "Running", task: str | None = "t", note: str | None = None
) -> ChangeLogEntry:
    return ChangeLogEntry(7, CID, task, frm, to, T0, note)


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        (entry("Finished"), EventType.EMAIL_SENT),
        (entry("Failed", note="550 no"), EventType.EMAIL_FAILED),
        (entry("Cancelled", frm="Pending", note="suppressed"), EventType.EMAIL_CANCELLED),
        (entry("Finished", frm="Finished", note="outcome: bounced"), EventType.EMAIL_BOUNCED),
        (entry("Finished", frm="Finished", note="outcome: replied"), EventType.EMAIL_REPLIED),
        (
            entry("Finished", frm="Finished", note="outcome: unsubscribed"),
            EventType.EMAIL_UNSUBSCRIBED,
        ),
        (
            entry("Finished", frm="Finished", note="outcome: complained"),
            EventType.EMAIL_COMPLAINED,
        ),
        (entry("completed", frm="active", task=None), EventType.CAMPAIGN_COMPLETED),
        (entry("paused", frm="active", task=None), EventType.CAMPAIGN_PAUSED),
    ],
)
def test_change_log_entries_map_to_event_types(change: ChangeLogEntry, kind: EventType) -> None:
    event = event_of(change)
    assert event is not None
    assert event.type is kind
    assert event.id == "evt_7"


@pytest.mark.parametrize(
    "change",
    [
        entry("Running", frm="Pending"),
        entry("Pending", frm="Running"),
        entry("Pending", frm="Pending", note="moved: x"),
        entry("progress", frm=None, task=None),
        entry("Finished", frm="Finished", note="outcome: accepted (unverified reply)"),
    ],
)
def test_other_changes_make_no_event(change: ChangeLogEntry) -> None:
    assert event_of(change) is None


def test_signature_follows_the_standard_webhooks_spec() -> None:
    key = b"0123456789abcdef01234567"
    secret = "whsec_" + base64.b64encode(key).decode()
    body = b'{"a":1}'
    expected = base64.b64encode(
        hmac.new(key, b"evt_1.1700000000." + body, hashlib.sha256).digest()
    ).decode()
    header = signature_header([secret], "evt_1", 1700000000, body)
    assert header == f"v1,{expected}"
    assert verify(secret, "evt_1", 1700000000, body, header)
    assert not verify(secret, "evt_1", 1700000001, body, header)


def test_the_standardwebhooks_library_verifies_a_delivery_during_a_rotation() -> None:
    old, new = ("whsec_" + base64.b64encode(k).decode() for k in (b"o" * 24, b"n" * 24))
    body = b'{"type":"email.sent"}'
    now = int(time.time())
    headers = signed_headers([new, old], "evt_7", now, body)
    for secret in (old, new):
        assert Webhook(secret).verify(body, headers) == {"type": "email.sent"}
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + base64.b64encode(b"x" * 24).decode()).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new).verify(body + b" ", headers)


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [backoff(n, base=5, cap=60) for n in range(6)] == [0, 5, 10, 20, 40, 60]


def test_add_shows_the_secret_once_and_refuses_bad_fields(world: World) -> None:
    created = world.service.add("http://hooks.example.com/in", events=["email.sent"])
    assert created.secret.startswith("whsec_")
    assert len(base64.b64decode(created.secret[6:])) >= 24
    shown = world.service.get(created.endpoint.id)
    assert created.secret not in repr(shown)
    assert shown.secret is not None and shown.secret.startswith("whsec_***")
    for kwargs, field in (
        ({"url": "ftp://x"}, "url"),
        ({"url": "http://x", "events": ["email.nope"]}, "events"),
        ({"url": "http://x", "campaigns": [""]}, "campaigns"),
    ):
        with pytest.raises(InvalidField) as caught:
            world.service.add(**kwargs)
        assert caught.value.field == field
    assert len(world.service.list()) == 1


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://hooks.example.com/caf\u00e9", "ASCII"),
        ("http://hooks.example.com/in?who=\u00e9", "ASCII"),
        ("http://hooks.example.com/a\x7fb", "control"),
        ("http://hooks.example.com/a\u0085b", "control"),
        ("http://hooks.example.com/a\u200bb", "control"),
    ],
)
def test_a_url_no_http_request_can_carry_is_refused(world: World, url: str, reason: str) -> None:
    with pytest.raises(InvalidField, match=reason) as caught:
        world.service.add(url)
    assert caught.value.field == "url"
    assert world.service.list() == []


def test_a_non_ascii_host_is_stored_in_its_idna_2008_form(world: World) -> None:
    """Python's idna codec (which sockets, http.client and ssl use for a str host) is IDNA
    2003: it would send faß.example's events to fass.example, another domain."""
    made = world.service.add("https://Faß.example:8443/in?x=1")
    assert made.endpoint.url == "https://xn--fa-hia.example:8443/in?x=1"
    changed = world.service.update(made.endpoint.id, url="http://\u03c0\u03c2.example/")
    assert changed.url == "http://xn--1xae.example/"
    with pytest.raises(InvalidField, match="IDNA 2008") as caught:
        world.service.add("https://a\u0301\u0301\u05d0.example/in")
    assert caught.value.field == "url"


def test_a_campaign_filter_names_campaigns_that_exist(world: World) -> None:
    """A mistyped campaign id made an endpoint that heard nothing, and its cursor moved past
    the campaign's events, so fixing the filter later could not bring them back."""
    with pytest.raises(InvalidField, match="no campaign") as caught:
        world.service.add("http://hooks.example.com/in", campaigns=[CID, "c0000000000fe"])
    assert (caught.value.field, caught.value.value) == ("campaigns", "c0000000000fe")
    assert world.service.list() == []
    made = world.service.add("http://hooks.example.com/in", campaigns=[f" {CID} "]).endpoint
    assert made.campaign_ids == [CID]
    with pytest.raises(InvalidField, match="no campaign"):
        world.service.update(made.id, campaigns=["C00000000000A"], enabled=False)
    assert world.service.get(made.id) == made


def test_no_repr_shows_a_secret(world: World) -> None:
    """An endpoint or a just-made secret in a log line, a failed assertion or a debugger's
    view shows no secret (as a sender's transport and an unsubscribe key)."""
    made = world.service.add("http://hooks.example.com/in")
    rotated = world.service.rotate_secret(made.endpoint.id)
    stored = world.store.get_endpoint(made.endpoint.id)
    assert stored is not None and stored.previous_secret == made.secret
    for value in (stored, made, rotated):
        for secret in (made.secret, rotated.secret):
            assert secret[6:] not in repr(value)


def test_production_refuses_http(world: World) -> None:
    service = WebhookService(world.store, world.store, world.clock, world.delivery, production=True)
    with pytest.raises(InvalidField, match="https"):
        service.add("http://hooks.example.com/in")
    assert service.add("https://hooks.example.com/in").endpoint.url.startswith("https")


def test_events_arrive_in_order_signed_with_their_change_ids(world: World) -> None:
    created = world.service.add("http://hooks.example.com/in")
    for position in range(3):
        world.send(position)
    report = world.delivery.run_pass()
    assert report.delivered == 3
    assert [body["type"] for _, _, body in world.receiver.got] == ["email.sent"] * 3
    data = world.receiver.got[0][2]["data"]
    assert isinstance(data, dict)
    assert data["recipient"] == "r0@example.com"
    assert data["message_id"] == "<m0@x>"
    assert data["outcome"] == "accepted"
    for _, headers, body in world.receiver.got:
        raw = json.dumps(body, separators=(",", ":")).encode()
        assert verify(
            created.secret,
            headers["webhook-id"],
            int(headers["webhook-timestamp"]),
            raw,
            headers["webhook-signature"],
        )
    assert world.delivery.run_pass().delivered == 0


def test_a_failing_head_blocks_the_rest_then_all_arrive_once_in_order(world: World) -> None:
    endpoint = world.service.add("http://hooks.example.com/in").endpoint
    world.receiver.down = True
    world.send(0)
    world.send(1)
    world.delivery.run_pass()
    state = world.service.get(endpoint.id)
    assert state.attempts == 1
    assert state.retry_at == T0 + timedelta(seconds=5)
    world.delivery.run_pass()  # before retry_at: nothing tried
    assert world.service.get(endpoint.id).attempts == 1
    world.clock.advance(5)
    world.delivery.run_pass()
    assert world.service.get(endpoint.id).retry_at == T0 + timedelta(seconds=15)
    world.receiver.down = False
    world.clock.advance(10)
    assert world.delivery.run_pass().delivered == 2
    ids = world.receiver.ids
    assert ids == sorted(ids, key=lambda i: int(i[4:]))
    log = world.service.deliveries(endpoint.id).deliveries
    assert [d.ok for d in log][:2] == [True, True]
    assert [d.attempt for d in log if d.event_id == ids[0]] == [3, 2, 1]


def test_an_endpoint_failing_past_the_limit_is_disabled_and_the_alarm_says_so(
    world: World,
) -> None:
    endpoint = world.service.add("http://hooks.example.com/in").endpoint
    world.receiver.down = True
    world.send(0)
    for _ in range(30):
        world.delivery.run_pass()
        world.clock.advance(60)
    view = world.service.get(endpoint.id)
    assert not view.enabled
    assert view.disabled_reason is not None and "503" in view.disabled_reason
    assert [d[0] for d in world.alarm.disabled] == [endpoint.id]
    world.receiver.down = False
    world.send(1)
    world.delivery.run_pass()
    assert world.receiver.got == []
    world.service.update(endpoint.id, enabled=True)
    world.delivery.run_pass()
    assert len(world.receiver.got) == 2


def test_filters_skip_other_types_and_campaigns(world: World) -> None:
    other = Campaign(id="c0000000000ff", name="o", policy=open_policy(), from_addr="a@x.com")
    world.store.create_campaign(other, [])
    world.service.add("http://a.example.com/", events=["campaign.paused"])
    world.service.add("http://b.example.com/", campaigns=[other.id])
    world.send(0)
    world.store.set_campaign_state(CID, [CampaignState.ACTIVE], CampaignState.PAUSED, at=T0)
    world.delivery.run_pass()
    assert [(u, b["type"]) for u, _, b in world.receiver.got] == [
        ("http://a.example.com/", "campaign.paused")
    ]


def test_redelivery_sends_the_same_ids_out_of_band(world: World) -> None:
    endpoint = world.service.add("http://hooks.example.com/in").endpoint
    world.send(0)
    world.delivery.run_pass()
    first = world.receiver.ids[0]
    again = world.service.redeliver(endpoint.id, event_ids=[first])
    assert [d.event_id for d in again] == [first]
    assert again[0].redelivery
    assert world.receiver.ids == [first, first]
    assert world.service.get(endpoint.id).cursor == int(first[4:])
    with pytest.raises(InvalidField) as caught:
        world.service.redeliver(endpoint.id, event_ids=["evt_1"])  # a claim makes no event
    assert caught.value.field == "events"
    with pytest.raises(InvalidField):
        world.service.redeliver(endpoint.id)


def test_failed_since_redelivers_the_failed_events(world: World) -> None:
    endpoint = world.service.add("http://hooks.example.com/in").endpoint
    world.receiver.down = True
    world.send(0)
    world.delivery.run_pass()
    world.receiver.down = False
    sent = world.service.redeliver(endpoint.id, failed_since=T0)
    assert [d.ok for d in sent] == [True]
    assert world.receiver.ids == [sent[0].event_id]


def test_rotation_signs_with_both_secrets_for_a_day(world: World) -> None:
    created = world.service.add("http://hooks.example.com/in")
    rotated = world.service.rotate_secret(created.endpoint.id)
    assert rotated.secret != created.secret
    world.send(0)
    world.delivery.run_pass()
    _, headers, body = world.receiver.got[0]
    raw = json.dumps(body, separators=(",", ":")).encode()
    signature = headers["webhook-signature"]
    assert len(signature.split()) == 2
    for secret in (created.secret, rotated.secret):
        assert verify(
            secret, headers["webhook-id"], int(headers["webhook-timestamp"]), raw, signature
        )
    world.clock.advance(86401)
    world.store.set_outcome(f"{CID}-0", TaskOutcome.BOUNCED, detail="5.1.1", at=world.clock.now())
    world.delivery.run_pass()
    assert world.receiver.got[1][2]["type"] == "email.bounced"
    assert len(world.receiver.got[1][1]["webhook-signature"].split()) == 1
    # two rotations within a day: the last two secrets sign, the first one no longer (the docs)
    again = world.service.rotate_secret(created.endpoint.id)
    world.clock.advance(3600)
    last = world.service.rotate_secret(created.endpoint.id)
    endpoint = world.store.get_endpoint(created.endpoint.id)
    assert endpoint is not None
    assert endpoint.signing_secrets(world.clock.now()) == [last.secret, again.secret]


def test_the_log_is_read_a_page_at_a_time_and_next_is_none_on_the_last(world: World) -> None:
    endpoint = world.service.add("http://hooks.example.com/in").endpoint
    world.store.record_deliveries(
        [DeliveryRecord(endpoint.id, f"evt_{n}", "email.sent", T0, 1, 5, 200) for n in range(4)]
    )
    first = world.service.deliveries(endpoint.id, limit=2)
    assert [d.event_id for d in first.deliveries] == ["evt_3", "evt_2"] and first.next
    last = world.service.deliveries(endpoint.id, limit=2, before=first.next)
    # a full last page says so: no cursor to an empty page
    assert [d.event_id for d in last.deliveries] == ["evt_1", "evt_0"] and last.next is None
    assert world.service.deliveries(endpoint.id, limit=4).next is None
    nothing = world.service.deliveries(endpoint.id, limit=0, before=first.next)
    assert nothing.deliveries == [] and nothing.next is None
    # with since, the log ends at its first attempt before it
    world.store.record_deliveries(
        [
            DeliveryRecord(endpoint.id, "evt_9", "email.sent", T0 - timedelta(days=8), 1, 5, 200),
            DeliveryRecord(endpoint.id, "evt_10", "email.sent", T0, 1, 5, 200),
        ]
    )
    recent = world.service.deliveries(endpoint.id, limit=1, since=T0)
    assert [d.event_id for d in recent.deliveries] == ["evt_10"] and recent.next is None
    with pytest.raises(InvalidField) as caught:
        world.service.deliveries(endpoint.id, before="evt_3")
    assert caught.value.field == "before"


def test_remove_and_unknown_ids(world: World) -> None:
    endpoint = world.service.add("http://hooks.example.com/in").endpoint
    world.service.remove(endpoint.id)
    for call in (
        lambda: world.service.get(endpoint.id),
        lambda: world.service.remove(endpoint.id),
        lambda: world.service.update(endpoint.id, url="http://x.example.com"),
        lambda: world.service.deliveries(endpoint.id),
    ):
        with pytest.raises(NotFound):
            call()


def test_an_event_id_is_the_change_id() -> None:
    assert event_id(42) == "evt_42"
    event = event_of(replace(entry("Finished"), id=42))
    assert event is not None
    assert event.id == "evt_42"


def test_a_dead_letter_becomes_a_dead_letter_event_and_the_alarm_still_goes_out(
    world: World,
) -> None:
    world.service.add("http://hooks.example.com/in")
    task = bare_task(CID, 0, T0)
    world.store.insert_tasks([task], at=T0)
    recorded = RecordingAlarm()
    scheduler = FakeScheduler(world.clock)
    alarm = DeadLetterLog(recorded, DeadLetterRelay(lambda: scheduler, lambda: world.store))
    letter = DeadLetter("dl1", "sq-x.0", "sq-c", {"task_id": task.id}, "store down", 3, T0)
    alarm.raise_alarm(letter)
    alarm.raise_alarm(replace(letter, id="dl2", payload={"task_id": "nope-1"}))
    assert [x.id for x in recorded.letters] == ["dl1", "dl2"]
    world.delivery.run_pass()
    assert [(b["type"], b["data"]["reason"]) for _, _, b in world.receiver.got] == [  # type: ignore[index]
        ("dead_letter", "store down")
    ]
    world.store.set_available(False)
    alarm.raise_alarm(replace(letter, id="dl3"))  # the store is down: the alarm goes out
    assert [x.id for x in recorded.letters][-1] == "dl3"


def test_an_email_failed_event_says_why_from_the_worker_and_the_reconciler() -> None:
    clock = FakeClock(T0)
    mailer = RecordingMailer()
    app = fake_app(clock=clock, mailer=mailer, stale_policy="fail", stale_after=900)
    cid = app.campaign_import.create(
        name="f", recipients=csv_bytes(2), policy=open_policy(), from_addr="a@example.com"
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    refused, lost = app.store.list_tasks(cid)
    # a worker claimed the second and died; the first is refused for good
    app.store.transition(lost.id, TaskState.PENDING, TaskState.RUNNING, at=clock.now(),
                         changes={"claimed_at": clock.now(), "attempts": 1})  # fmt: skip
    mailer.fail_next(PermanentMailError("550 5.1.1 no such user"))
    clock.advance(hours=1)
    scheduler = app.scheduler
    assert isinstance(scheduler, FakeScheduler)
    scheduler.fire_due(app.invoke)
    assert app.reconciler.run().stale_failed == 1
    reasons = {}
    for change in app.store.changes_after(0, limit=100):
        event = event_of(change)
        if event is not None and event.type is EventType.EMAIL_FAILED:
            task = app.store.get_task(change.task_id or "")
            body = json.loads(event_body(event, EventTask.of(task) if task else None))
            reasons[body["data"]["task_id"]] = body["data"]["reason"]
    assert reasons.keys() == {refused.id, lost.id}
    assert reasons[refused.id] == "permanent: 550 5.1.1 no such user"
    assert reasons[lost.id].startswith("stale: outcome unknown: the worker did not finish")
