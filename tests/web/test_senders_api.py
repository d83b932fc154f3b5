"""``/api/senders`` on real SQLite files: the operations, usage from the store's bookings, no
credentials in any response (errors and pages included), errors naming the field with nothing
changed, CSRF like every other write, and the senders and local time of a new campaign."""

from __future__ import annotations

from dataclasses import replace
from datetime import date, datetime, timedelta
from typing import Any, cast

import pytest

from sendqueue.domain.senders import Booking
from sendqueue.ports import FeedbackStore
from tests.support.app import T0
from tests.web.conftest import Web
from tests.web.test_api import _error

SECRET = "hunter2-very-secret"
TRANSPORT = f"smtp://anna:{SECRET}@mail.example.com:587?security=starttls"
MASKED = "smtp://anna:***@mail.example.com:587"


def _add(web: Web, status: int = 201, **body: Any) -> dict[str, Any]:
    response = web.client.post("/api/senders", json={"email": "anna@example.com", **body})
    assert response.status_code == status, response.text
    assert SECRET not in response.text
    data: dict[str, Any] = response.json()
    return data


def _senders(web: Web) -> list[dict[str, Any]]:
    response = web.client.get("/api/senders")
    assert response.status_code == 200 and SECRET not in response.text
    listed: list[dict[str, Any]] = response.json()["senders"]
    return listed


def _book(web: Web, sender_id: str, day: date, count: int, *, cap: int, first: int = 0) -> None:
    """``count`` planned sends of the sender on ``day`` (UTC), a minute apart from 12:00."""
    noon = datetime(day.year, day.month, day.day, 12, tzinfo=T0.tzinfo)
    web.container.sender_store.book(
        [
            Booking(
                sender_id=sender_id,
                at=noon + timedelta(minutes=first + i),
                day=day,
                task_id=f"cbook-{day.isoformat()}-{first + i}",
                campaign_id="cbook",
                recipient=f"r{first + i}@example.com",
                cap=cap,
            )
            for i in range(count)
        ]
    )


def test_add_list_get_update_remove(web: Web) -> None:
    response = web.client.post(
        "/api/senders",
        json={
            "email": "anna@example.com", "name": "Anna Sales", "daily_cap": 30,
            "min_gap_seconds": 120, "timezone": "Europe/Berlin", "transport": TRANSPORT,
            "reply_to": "replies@example.com",
        },
    )  # fmt: skip
    assert response.status_code == 201, response.text
    added = response.json()
    sid = added["id"]
    assert response.headers["Location"] == f"/api/senders/{sid}"
    assert {k: v for k, v in added.items() if k not in {"id", "usage"}} == {
        "email": "anna@example.com", "name": "Anna Sales", "reply_to": "replies@example.com",
        "transport": MASKED, "daily_cap": 30, "min_gap_seconds": 120,
        "timezone": "Europe/Berlin", "warmup_start": None, "warmup_step": None,
        "warmup_from": None, "imap": None, "signature_text": "", "signature_html": None,
        "oauth": None, "mailbox": None,
    }  # fmt: skip
    assert len(added["usage"]) == 14
    assert added["usage"][0] == {"date": "2026-12-01", "planned": 0, "sent": 0, "cap": 30}
    _add(web, email="bob@example.com")

    listed = _senders(web)
    assert [s["email"] for s in listed] == ["anna@example.com", "bob@example.com"]
    assert "usage" not in listed[0] and listed[1]["timezone"] == "UTC"
    by_address = web.client.get("/api/senders/ANNA@example.com").json()
    assert by_address == web.client.get(f"/api/senders/{sid}").json() == added
    assert len(web.client.get(f"/api/senders/{sid}", params={"days": 3}).json()["usage"]) == 3

    patched = web.client.patch(f"/api/senders/{sid}", json={"daily_cap": 40, "reply_to": None})
    assert patched.status_code == 200, patched.text
    assert (patched.json()["daily_cap"], patched.json()["reply_to"]) == (40, None)
    assert patched.json()["transport"] == MASKED
    assert (
        web.client.patch(f"/api/senders/{sid}", json={"transport": None}).json()["transport"]
        is None
    )

    removed = web.client.delete("/api/senders/bob@example.com")
    assert removed.status_code == 200 and removed.json()["email"] == "bob@example.com"
    assert [s["id"] for s in _senders(web)] == [sid]
    assert _error(web.client.get("/api/senders/bob@example.com"), 404)
    assert _error(web.client.delete("/api/senders/bob@example.com"), 404)
    assert _error(web.client.patch("/api/senders/s000000000000", json={"name": "x"}), 404)


def test_usage_counts_the_bookings_against_the_warm_up_cap(web: Web) -> None:
    sid = _add(web, daily_cap=10, warmup_start=2, warmup_step=3)["id"]
    today = T0.date()
    _book(web, sid, today, 2, cap=2)
    _book(web, sid, today + timedelta(days=2), 4, cap=5)
    assert web.container.sender_store.mark_sent(f"cbook-{today.isoformat()}-0")
    usage = web.client.get(f"/api/senders/{sid}").json()["usage"]
    # the ramp moves on per sending day (the 1st and the 3rd), not per calendar day
    assert usage[:5] == [
        {"date": "2026-12-01", "planned": 1, "sent": 1, "cap": 2},
        {"date": "2026-12-02", "planned": 0, "sent": 0, "cap": 5},
        {"date": "2026-12-03", "planned": 4, "sent": 0, "cap": 5},
        {"date": "2026-12-04", "planned": 0, "sent": 0, "cap": 8},
        {"date": "2026-12-05", "planned": 0, "sent": 0, "cap": 8},
    ]
    # ending the warm-up: the full cap from today
    ended = web.client.patch(f"/api/senders/{sid}", json={"warmup_start": None})
    assert ended.status_code == 200, ended.text
    assert (ended.json()["warmup_step"], ended.json()["usage"][0]["cap"]) == (None, 10)


_BAD_NEW = [
    ({"email": "not-an-address"}, "email"),
    ({"email": None}, "email"),
    ({"daily_cap": 0}, "daily_cap"),
    ({"daily_cap": "many"}, "daily_cap"),
    ({"daily_cap": True}, "daily_cap"),
    ({"min_gap_seconds": 86_401}, "min_gap_seconds"),
    ({"timezone": "Mars/Olympus"}, "timezone"),
    ({"warmup_start": 5}, "warmup_step"),
    ({"warmup_start": 60, "warmup_step": 1}, "warmup_start"),
    ({"transport": "http://example.com"}, "transport"),
    ({"transport": f"smtp://anna:{SECRET}@h\n:25"}, "transport"),
    ({"transport": f"smtp://anna:{SECRET}@h:port"}, "transport"),
    ({"transport": f"smtp://anna:{SECRET}@[::1"}, "transport"),
    ({"reply_to": "nope"}, "reply_to"),
    ({"name": "A\r\nBcc: x@example.com"}, "name"),
    ({"id": "s123"}, "id"),
    ({"warmup_from": "2026-01-01"}, "warmup_from"),
]


@pytest.mark.parametrize(("body", "field"), _BAD_NEW, ids=[f for _, f in _BAD_NEW])
def test_a_bad_new_sender_is_a_422_naming_the_field_and_adds_nothing(
    web: Web, body: dict[str, Any], field: str
) -> None:
    response = web.client.post(
        "/api/senders", json={"email": "a@example.com", "transport": TRANSPORT, **body}
    )
    assert _error(response, 422)["field"] == field
    assert SECRET not in response.text
    assert _senders(web) == []


def test_a_missing_email_quotes_the_body_masked(web: Web) -> None:
    response = web.client.post("/api/senders", json={"transport": TRANSPORT})
    error = _error(response, 422)
    assert error["field"] == "email"
    assert SECRET not in response.text and "anna:***@" in response.text
    assert _error(web.client.post("/api/senders", json=[TRANSPORT]), 422)
    assert _senders(web) == []


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"daily_cap": 0}, "daily_cap"),
        ({"daily_cap": None}, "daily_cap"),
        ({"email": "bob@example.com"}, "email"),  # taken: 409, naming the field
        ({"email": None}, "email"),
        ({"timezone": "Nowhere/Land"}, "timezone"),
        ({"transport": f"imap://anna:{SECRET}@mail.example.com"}, "transport"),
        ({"warmup_step": 3}, "warmup_start"),
        ({"id": "s1"}, "id"),
        ({}, "body"),
    ],
)
def test_a_refused_update_changes_nothing(web: Web, changes: dict[str, Any], field: str) -> None:
    sid = _add(web, transport=TRANSPORT)["id"]
    _add(web, email="bob@example.com")
    before = _senders(web)
    response = web.client.patch(f"/api/senders/{sid}", json=changes)
    status = 409 if changes.get("email") == "bob@example.com" else 422
    assert _error(response, status)["field"] == field
    assert SECRET not in response.text
    assert _senders(web) == before
    assert web.container.sender_store.get_sender(sid).transport == TRANSPORT


def test_a_taken_address_is_a_409_naming_email(web: Web) -> None:
    _add(web)
    taken = web.client.post("/api/senders", json={"email": "ANNA@example.com"})
    assert _error(taken, 409)["field"] == "email"
    assert len(_senders(web)) == 1


def test_a_sender_with_planned_sends_is_not_removed(web: Web) -> None:
    sid = _add(web)["id"]
    _book(web, sid, T0.date(), 2, cap=50)
    refused = web.client.delete(f"/api/senders/{sid}")
    assert "2 planned sends" in _error(refused, 409)["message"]
    assert [s["id"] for s in _senders(web)] == [sid]
    assert web.client.get(f"/api/senders/{sid}").json()["usage"][0]["planned"] == 2


def test_credentials_are_in_no_response(web: Web) -> None:
    sid = _add(web, transport=TRANSPORT, name="Anna")["id"]
    cid = web.create(2, senders=[sid])["id"]
    assert web.container.provisioner.provision(cid).status == "done"
    responses = [
        web.client.get("/api/senders"),
        web.client.get(f"/api/senders/{sid}"),
        web.client.get("/api/senders/anna@example.com"),
        web.client.patch(f"/api/senders/{sid}", json={"name": "Anna S"}),
        web.client.patch(f"/api/senders/{sid}", json={"transport": TRANSPORT + "&x=1"}),
        web.client.post("/api/senders", json={"email": "anna@example.com", "transport": TRANSPORT}),
        web.client.get(f"/api/campaigns/{cid}"),
        web.client.get(f"/api/campaigns/{cid}/tasks"),
        web.client.get("/senders"),
        web.client.get("/campaigns/new"),
        web.client.get(f"/campaigns/{cid}"),
        web.client.get("/openapi.json"),
    ]
    for response in responses:
        assert response.status_code < 500, response.text
        assert SECRET not in response.text, response.request.url
    assert MASKED in responses[0].text and MASKED in responses[8].text
    # the store keeps it whole: the worker needs it
    assert SECRET in str(web.container.sender_store.get_sender(sid).transport)


def test_writes_need_the_csrf_token_from_a_browser(web: Web) -> None:
    sid = _add(web)["id"]
    browser = {"Origin": "http://testserver"}
    forged = [
        web.client.post("/api/senders", json={"email": "b@example.com"}, headers=browser),
        web.client.patch(f"/api/senders/{sid}", json={"daily_cap": 5}, headers=browser),
        web.client.delete(f"/api/senders/{sid}", headers=browser),
    ]
    assert [r.status_code for r in forged] == [403, 403, 403]
    assert [(s["email"], s["daily_cap"]) for s in _senders(web)] == [("anna@example.com", 50)]
    csrf = {**browser, "X-CSRF-Token": web.client.cookies["sq_csrf"]}
    ok = web.client.post("/api/senders", json={"email": "b@example.com"}, headers=csrf)
    assert ok.status_code == 201


def test_a_campaign_takes_senders_and_local_time(web: Web) -> None:
    anna = _add(web)["id"]
    bob = _add(web, email="bob@example.com")["id"]
    created = web.create(3, senders=["anna@example.com", bob], local_time=True)
    assert (created["senders"], created["local_time"]) == ([anna, bob], True)
    shown = web.client.get(f"/api/campaigns/{created['id']}").json()
    assert (shown["senders"], shown["local_time"]) == ([anna, bob], True)
    plain = web.create(1)
    assert (plain["senders"], plain["local_time"]) == ([], False)

    # an unknown or repeated sender, or a local_time that is not a bool: nothing is created
    before = web.client.get("/api/campaigns").json()
    bad: list[tuple[dict[str, Any], str]] = [
        ({"senders": ["nobody@example.com"]}, "senders"),
        ({"senders": [anna, "anna@example.com"]}, "senders"),
        ({"senders": "anna@example.com"}, "senders"),
        ({"local_time": "yes"}, "local_time"),
    ]
    for body, field in bad:
        response = web.client.post(
            "/api/campaigns",
            json={
                "name": "Bad", "recipients": [{"email": "a@example.com"}],
                "templates": {"subject": "S", "body": "B"}, **body,
            },
        )  # fmt: skip
        assert _error(response, 422)["field"] == field, body
    assert web.client.get("/api/campaigns").json() == before


def test_the_form_takes_senders_and_local_time(web: Web) -> None:
    anna = _add(web)["id"]
    bob = _add(web, email="bob@example.com")["id"]
    csv = b"email,name,timezone\na@example.com,A,Asia/Tokyo\nb@example.com,B,\n"
    fields: dict[str, Any] = {
        "name": "Form", "subject": "S", "body": "B", "timezone": "UTC",
        "senders": [anna, "bob@example.com"], "local_time": "true",
    }  # fmt: skip
    response = web.client.post(
        "/api/campaigns", data=fields, files={"file": ("r.csv", csv, "text/csv")}
    )
    assert response.status_code == 201, response.text
    assert (response.json()["senders"], response.json()["local_time"]) == ([anna, bob], True)
    bad = web.client.post(
        "/api/campaigns",
        data={"name": "Form", "subject": "S", "body": "B", "senders": "s0000000000ff"},
        files={"file": ("r.csv", csv, "text/csv")},
    )
    assert _error(bad, 422)["field"] == "senders"
    assert len(web.client.get("/api/campaigns").json()["campaigns"]) == 1


def test_task_rows_carry_the_address_they_go_out_from(web: Web) -> None:
    sid = _add(web)["id"]
    with_sender = web.create(3, senders=[sid])["id"]
    without = web.create(2, **{"from": "News <news@example.com>"})["id"]
    for cid in (with_sender, without):
        assert web.container.provisioner.provision(cid).status == "done"
    tasks = web.client.get(f"/api/campaigns/{with_sender}/tasks").json()["tasks"]
    assert [t["sender"] for t in tasks] == ["anna@example.com"] * 3
    others = web.client.get(f"/api/campaigns/{without}/tasks").json()["tasks"]
    assert {t["sender"] for t in others} == {"News <news@example.com>"}
    cancelled = web.client.post(f"/api/campaigns/{with_sender}/tasks/{tasks[0]['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["sender"] == "anna@example.com"
    page = web.client.get(f"/campaigns/{with_sender}")
    assert page.text.count('data-field="sender">anna@example.com<') == 3
    assert sum(d["planned"] for d in web.client.get(f"/api/senders/{sid}").json()["usage"]) == 2


def test_a_stored_preview_counts_each_recipient_zone(web: Web) -> None:
    created = web.create(
        3,
        local_time=True,
        recipients=[
            {"email": "a@example.com", "timezone": "Asia/Tokyo"},
            {"email": "b@example.com", "timezone": "America/New_York"},
            {"email": "c@example.com"},
        ],
    )
    preview = web.client.get(f"/api/campaigns/{created['id']}/preview").json()
    zones = {z["zone"]: z["count"] for z in preview["zones"]}
    assert zones == {"UTC": 1, "Asia/Tokyo": 1, "America/New_York": 1}
    assert all(z["days"] for z in preview["zones"])
    assert {(s["email"], s["zone"]) for s in preview["sends"]} == {
        ("a@example.com", "Asia/Tokyo"), ("b@example.com", "America/New_York"),
        ("c@example.com", "UTC"),
    }  # fmt: skip
    plain = web.client.get(f"/api/campaigns/{web.create(2)['id']}/preview").json()
    assert [(z["zone"], z["count"]) for z in plain["zones"]] == [("UTC", 2)]


def test_the_senders_page_shows_usage_against_the_cap(web: Web) -> None:
    empty = web.client.get("/senders")
    assert empty.status_code == 200 and "No sender yet" in empty.text
    assert '<span id="senders-count">0 senders</span>' in empty.text
    sid = _add(web, daily_cap=5, transport=TRANSPORT)["id"]
    _book(web, sid, T0.date(), 3, cap=5)
    page = web.client.get("/senders", params={"added": sid})
    assert page.status_code == 200
    text = page.text
    assert f'id="usage-chart-{sid}"' in text and f'id="usage-{sid}"' in text
    assert "3 planned and 0 sent over 14 days, of 70 the caps allow" in text
    assert '<tr data-date="2026-12-01">' in text
    assert '<td class="num" data-field="free">2</td>' in text
    assert f"Sender anna@example.com ({sid}) added." in text
    assert MASKED in text and SECRET not in text
    assert 'href="/senders" aria-current="page"' in text
    assert '<span id="senders-count">1 sender</span>' in text
    new = web.client.get("/campaigns/new").text
    assert f'name="senders" value="{sid}"' in new and 'name="local_time"' in new


def test_the_preview_of_a_new_campaign_plans_over_its_senders(web: Web) -> None:
    anna = _add(web, daily_cap=2)["id"]
    body = {
        "name": "p", "recipients": [{"email": f"p{i}@example.com"} for i in range(5)],
        "templates": {"subject": "S", "body": "B"}, "senders": [anna],
        "policy": {"timezone": "Europe/Berlin", "per_day": 10, "weekdays": ["mon", "tue"],
                   "windows": ["09:00-17:00"], "start": "2026-12-01T09:00"},
    }  # fmt: skip
    response = web.client.post("/api/campaigns/preview", json=body)
    assert response.status_code == 200, response.text
    days = {d["day"]: d["count"] for d in response.json()["days"]}
    # The campaign allows 10 a day; the sender's cap of 2 spreads the 5 over three days.
    assert sum(days.values()) == 5 and max(days.values()) == 2
    assert web.client.get(f"/api/senders/{anna}").json()["usage"][0]["planned"] == 0


def test_a_senders_mailbox_state_shows_in_the_api_and_the_page_with_no_password(
    web: Web,
) -> None:
    sid = _add(web)["id"]
    store = web.container.sender_store
    imap = f"imap://anna:{SECRET}@127.0.0.1:1143/INBOX?security=none"
    store.update_sender(replace(store.get_sender(sid), imap=imap))
    shown = "imap://anna@127.0.0.1:1143/INBOX"
    got = web.client.get(f"/api/senders/{sid}").json()["mailbox"]
    assert got == {"mailbox": shown, "polled_at": None, "messages_read": 0, "last_error": None}
    key = f"sender:{sid}:{shown}"
    feedback = cast(FeedbackStore, web.container.store)
    feedback.record_mailbox_pass(key, at=T0, messages=4, error=None)
    feedback.record_mailbox_pass(
        key, at=T0 + timedelta(minutes=1), messages=0, error=f"{shown}: timed out after 30s"
    )
    response = web.client.get(f"/api/senders/{sid}")
    assert SECRET not in response.text
    assert response.json()["mailbox"] == {
        "mailbox": shown,
        "polled_at": (T0 + timedelta(minutes=1)).isoformat(),
        "messages_read": 4,
        "last_error": f"{shown}: timed out after 30s",
    }
    page = web.client.get("/senders")
    assert page.status_code == 200 and SECRET not in page.text
    assert "4 messages read in all" in page.text
    assert f"{shown}: timed out after 30s" in page.text
