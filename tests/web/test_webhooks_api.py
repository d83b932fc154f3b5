"""``/api/webhooks`` on real SQLite files: add (the secret once), list, get, update, remove,
rotate, redeliver and the delivery log; errors name the field and change nothing; the secret
is masked in every other answer; a redrive relays its letter (the dead_letter event) first."""

from __future__ import annotations

from typing import Any, cast

from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.webhooks import DeliveryRecord
from sendqueue.ports.webhooks import WebhookStore
from sendqueue.services.webhooks import WebhookDelivery
from tests.support.app import T0
from tests.unit.test_webhooks import Receiver
from tests.web.conftest import Web
from tests.web.test_api import _error

URL = "http://hooks.example.com/in"


def _receiver(web: Web) -> Receiver:
    """Deliveries of this container go to an in-process receiver."""
    receiver = Receiver()
    store = cast(Any, web.container.store)
    web.container.__dict__["webhook_delivery"] = WebhookDelivery(store, store, receiver, web.clock)
    return receiver


def _add(web: Web, **body: Any) -> dict[str, Any]:
    response = web.client.post("/api/webhooks", json={"url": URL, **body})
    assert response.status_code == 201, response.text
    data: dict[str, Any] = response.json()
    assert response.headers["location"] == f"/api/webhooks/{data['id']}"
    return data


def test_add_list_get_update_remove(web: Web) -> None:
    made = _add(web, events=["email.sent", "email.failed"])
    secret = made["signing_secret"]
    assert secret.startswith("whsec_") and made["secret"].startswith("whsec_***")
    assert made["id"].startswith("wh_") and made["enabled"]
    listed = web.client.get("/api/webhooks")
    assert [w["id"] for w in listed.json()["webhooks"]] == [made["id"]]
    one = web.client.get(f"/api/webhooks/{made['id']}")
    for response in (listed, one):
        assert secret not in response.text and secret[6:] not in response.text
    assert one.json()["event_types"] == ["email.sent", "email.failed"]
    cid = web.create()["id"]
    changed = web.client.patch(
        f"/api/webhooks/{made['id']}", json={"enabled": False, "campaigns": [cid]}
    )
    assert changed.status_code == 200, changed.text
    assert changed.json()["enabled"] is False
    assert changed.json()["disabled_reason"] == "disabled by a user"
    assert changed.json()["campaign_ids"] == [cid]
    assert web.client.delete(f"/api/webhooks/{made['id']}").json() == {"removed": made["id"]}
    _error(web.client.get(f"/api/webhooks/{made['id']}"), 404)


def test_bad_input_names_the_field_and_stores_nothing(web: Web) -> None:
    for body, field in (
        ({"url": "ftp://x.example.com"}, "url"),
        ({"url": URL, "events": ["email.nope"]}, "events"),
        ({"url": URL, "campaigns": [" "]}, "campaigns"),
        ({"url": URL, "campaigns": ["c0123456789ab"]}, "campaigns"),
    ):
        error = _error(web.client.post("/api/webhooks", json=body), 422)
        assert error["field"] == field
    _error(web.client.post("/api/webhooks", json={"url": URL, "secret": "x"}), 422)
    assert web.client.get("/api/webhooks").json() == {"webhooks": []}
    made = _add(web)
    error = _error(web.client.patch(f"/api/webhooks/{made['id']}", json={"url": "gopher://x"}), 422)
    assert error["field"] == "url"
    assert web.client.get(f"/api/webhooks/{made['id']}").json()["url"] == URL
    _error(web.client.patch(f"/api/webhooks/{made['id']}", json={}), 422)
    for name in ("enabled", "url", "events", "campaigns"):  # null would change nothing
        patch = {name: None, "enabled": False} if name != "enabled" else {name: None}
        error = _error(web.client.patch(f"/api/webhooks/{made['id']}", json=patch), 422)
        assert error["field"] == name, (name, error)
    assert web.client.get(f"/api/webhooks/{made['id']}").json()["enabled"] is True
    redo = f"/api/webhooks/{made['id']}/redeliver"
    error = _error(web.client.post(redo, json={"failed_since": "2026-12-01T08:00"}), 422)
    assert error["field"] == "failed_since"
    assert error["reason"] == "must be a time with its offset, e.g. 2026-12-04T10:00Z"


def test_rotate_redeliver_and_the_log(web: Web) -> None:
    receiver = _receiver(web)
    made = _add(web)
    rotated = web.client.post(f"/api/webhooks/{made['id']}/rotate-secret")
    assert rotated.status_code == 200, rotated.text
    assert rotated.json()["signing_secret"] != made["signing_secret"]
    assert rotated.json()["previous_secret_expires_at"] is not None
    cid = web.active(1)
    store = web.container.store
    at = web.clock.now()
    assert store.transition(f"{cid}-0", TaskState.PENDING, TaskState.CANCELLED, at=at, note="x")
    web.container.webhook_delivery.run_pass()
    assert [b["type"] for _, _, b in receiver.got] == ["email.cancelled"]
    assert cast(dict[str, Any], receiver.got[0][2]["data"])["reason"] == "x"
    event = receiver.ids[0]
    again = web.client.post(f"/api/webhooks/{made['id']}/redeliver", json={"events": [event]})
    assert again.status_code == 200, again.text
    assert [d["event_id"] for d in again.json()["deliveries"]] == [event]
    assert receiver.ids == [event, event]
    log = web.client.get(f"/api/webhooks/{made['id']}/deliveries").json()["deliveries"]
    assert [(d["event_id"], d["redelivery"], d["ok"]) for d in log] == [
        (event, True, True),
        (event, False, True),
    ]
    error = _error(
        web.client.post(f"/api/webhooks/{made['id']}/redeliver", json={"events": ["nope"]}), 422
    )
    assert error["field"] == "events"
    _error(web.client.post("/api/webhooks/wh_0/redeliver", json={"events": [event]}), 404)


def test_the_log_pages_with_before_and_next(web: Web) -> None:
    made = _add(web)
    other = _add(web)
    at = web.clock.now()
    log = cast(WebhookStore, web.container.store)
    log.record_deliveries(
        [DeliveryRecord(made["id"], f"evt_{n}", "email.sent", at, 1, 9, 200) for n in range(5)]
        + [DeliveryRecord(other["id"], "evt_9", "email.sent", at, 1, 9, 200)]
    )
    url = f"/api/webhooks/{made['id']}/deliveries"
    first = web.client.get(url, params={"limit": 2}).json()
    assert [d["event_id"] for d in first["deliveries"]] == ["evt_4", "evt_3"]
    second = web.client.get(url, params={"limit": 2, "before": first["next"]}).json()
    assert [d["event_id"] for d in second["deliveries"]] == ["evt_2", "evt_1"]
    last = web.client.get(url, params={"limit": 2, "before": second["next"]}).json()
    assert [d["event_id"] for d in last["deliveries"]] == ["evt_0"] and last["next"] is None
    assert web.client.get(url).json()["next"] is None  # all of it on one page
    theirs = log.deliveries(other["id"])[0].cursor
    assert theirs is not None
    for bad in ("nope", first["next"] + "=", theirs, "", "A" * 401):
        error = _error(web.client.get(url, params={"before": bad}), 422)
        assert error["field"] == "before", (bad, error)
    _error(web.client.get("/api/webhooks/wh_0/deliveries", params={"before": "x"}), 404)


def test_a_redrive_relays_its_letter_first_and_removes_nothing_while_the_store_is_down(
    make_web: Any,
) -> None:
    web = make_web(flaky=True)
    receiver = _receiver(web)
    _add(web)
    cid = web.active(1)
    [task] = web.container.store.list_tasks(cid)
    scheduler: Any = web.container.scheduler
    scheduler.create(
        "sq-dl", "sq-test", T0.replace(tzinfo=None), "UTC", {"task_id": task.id}, "tok-dl", 0
    )

    def fail(_: Any) -> None:
        raise RuntimeError("boom: the target failed")

    web.store.down = True  # the alarm cannot relay the letter: it waits in the queue alone
    scheduler.fire_due(fail)
    [letter] = web.client.get("/api/dead-letters").json()["dead_letters"]
    _error(web.client.post(f"/api/dead-letters/{letter['id']}/redrive"), 503)
    _error(web.client.post("/api/dead-letters/redrive"), 503)
    assert [d["id"] for d in web.client.get("/api/dead-letters").json()["dead_letters"]] == [
        letter["id"]
    ]
    web.store.down = False
    assert web.client.post(f"/api/dead-letters/{letter['id']}/redrive").status_code == 200
    web.container.webhook_delivery.run_pass()
    dead = [b for _, _, b in receiver.got if b["type"] == "dead_letter"]
    assert [(b["data"]["task_id"], b["data"]["reason"]) for b in dead] == [  # type: ignore[index]
        (task.id, "RuntimeError: boom: the target failed")
    ]
