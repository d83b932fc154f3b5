"""The HTTP API, route by route, on real SQLite files: shapes, errors, and nothing written when
a request is refused."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest

from sendqueue.domain.errors import (
    InvalidField,
    InvalidInput,
    PermanentMailError,
    SchedulerError,
)
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.outages import utc_span
from sendqueue.services.importing.recipients import Templates
from sendqueue.services.importing.rows import parse_recipient_rows
from sendqueue.web.app import create_app
from sendqueue.web.bodies import BODY_OVERHEAD_BYTES
from sendqueue.web.queries import campaign_timeline
from tests.support.app import T0, csv_bytes
from tests.support.real import wait_until
from tests.web.conftest import Web

POLICY_FORM = {
    "timezone": "UTC",
    "per_day": "10000",
    "weekdays": "mon-sun",
    "windows": "00:00-12:00,12:00-24:00",
}


def _error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()["error"]
    assert body["status"] == status
    assert body["message"]
    return body


def _nothing_written(web: Web) -> None:
    assert web.client.get("/api/campaigns").json() == {"campaigns": []}
    assert web.container.store.list_campaigns() == []


# -- health, metrics, docs ----------------------------------------------------------------------


def test_healthz(web: Web) -> None:
    response = web.client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_openapi_documents_the_routes(web: Web) -> None:
    schema = web.client.get("/openapi.json").json()
    for path in (
        "/api/campaigns",
        "/api/campaigns/preview",
        "/api/campaigns/{campaign_id}/tasks",
        "/api/campaigns/{campaign_id}/events",
        "/api/dead-letters/{letter_id}/redrive",
        "/api/suppressions",
        "/api/suppressions/{email}",
        "/api/suppressions/import",
        "/api/suppressions/export",
    ):
        assert path in schema["paths"]
    content = schema["paths"]["/api/campaigns"]["post"]["requestBody"]["content"]
    assert set(content) == {"multipart/form-data", "application/json"}
    docs = web.client.get("/docs")
    assert docs.status_code == 200
    assert "frame-ancestors 'none'" in docs.headers["content-security-policy"]


def _dead_letter(web: Web, name: str) -> None:
    scheduler: Any = web.container.scheduler
    scheduler.create(
        name, "sq-test", T0.replace(tzinfo=None), "UTC", {"kind": "test"}, f"tok-{name}", 0
    )

    def fail(_: Any) -> None:
        raise RuntimeError("boom: the target failed")

    scheduler.fire_due(fail)


def test_metrics_render_prometheus_text_with_the_dead_letter_depth(web: Web) -> None:
    _dead_letter(web, "sq-test-1")
    _dead_letter(web, "sq-test-2")
    response = web.client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    for name, kind in [
        ("sendqueue_sends_total", "counter"),
        ("sendqueue_send_lateness_seconds", "histogram"),
        ("sendqueue_dead_letter_depth", "gauge"),
        ("sendqueue_reconciler_repairs_total", "counter"),
        ("sendqueue_alarms_total", "counter"),
    ]:
        assert f"# TYPE {name} {kind}\n" in text
    assert "\nsendqueue_dead_letter_depth 2.0\n" in text
    web.client.post("/api/dead-letters/redrive")
    assert "\nsendqueue_dead_letter_depth 0.0\n" in web.client.get("/metrics").text


# -- create ------------------------------------------------------------------------------------


def test_create_from_csv_upload(web: Web) -> None:
    csv = csv_bytes(3) + b"user1@example.com,Again,Dup,Dup\n"
    response = web.client.post(
        "/api/campaigns",
        data={**POLICY_FORM, "name": "December", "from": "News <news@example.com>"},
        files={"file": ("people.csv", csv, "text/csv")},
    )
    assert response.status_code == 201, response.text
    data = response.json()
    assert data["name"] == "December"
    assert data["state"] == "draft"
    assert data["from"] == "News <news@example.com>"
    assert data["recipients"] == 3
    assert data["import"] == {"rows": 4, "duplicates": 1, "duplicate_rows": [5]}
    assert data["policy"]["windows"] == ["00:00-12:00", "12:00-24:00"]
    assert data["policy_text"].startswith("10000 a day, every day")
    assert data["next_send_at"] is None
    assert set(data["counts"]) == {s.value for s in TaskState}
    listed = web.client.get("/api/campaigns").json()["campaigns"]
    assert [c["id"] for c in listed] == [data["id"]]


def test_create_from_json_renders_templates_with_row_variables(web: Web) -> None:
    data = web.create(
        2,
        recipients=[
            {"email": "ada@example.com", "name": "Ada", "company": "AE"},
            {"email": "bob@example.com", "name": "Bob", "company": 42},
        ],
        templates={"subject": "News for {{ company }}", "body": "Hi {{ name }}", "html": None},
        reply_to="replies@example.com",
    )
    assert data["recipients"] == 2
    assert data["reply_to"] == "replies@example.com"
    cid = data["id"]
    assert web.container.provisioner.provision(cid).status == "done"
    tasks = web.client.get(f"/api/campaigns/{cid}/tasks").json()["tasks"]
    assert [(t["email"], t["subject"], t["name"]) for t in tasks] == [
        ("ada@example.com", "News for AE", "Ada"),
        ("bob@example.com", "News for 42", "Bob"),
    ]
    assert set(tasks[0]) == {
        "id", "position", "step", "email", "name", "subject", "sender", "sender_name", "timezone",
        "state", "send_at", "sent_at", "attempts", "message_id", "error", "planned_at", "moves",
        "moved_reason", "reason", "outcome", "outcome_detail", "outcome_at", "paused", "late",
    }  # fmt: skip
    # no senders: every email goes out from the campaign's From
    assert {t["sender"] for t in tasks} == {data["from"]}


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        ({"per_day": 0}, "per_day"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"windows": ["22:00-02:00"]}, "windows"),
        ({"weekdays": "funday"}, "weekdays"),
        ({"start": "yesterday"}, "start"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_create_refuses_a_bad_policy_field_and_writes_nothing(
    web: Web, policy: dict[str, Any], field: str
) -> None:
    response = web.client.post(
        "/api/campaigns",
        json={"name": "x", "recipients": [{"email": "a@example.com", "subject": "s", "body": "b"}],
              "policy": policy},
    )  # fmt: skip
    error = _error(response, 422)
    assert error["field"] == field
    assert error["reason"]
    assert "value" in error
    _nothing_written(web)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"recipients": []}, "name"),
        ({"name": "x", "recipients": "a@example.com"}, "recipients"),
        ({"name": "x", "recipients": [], "colour": 1}, "colour"),
        ({"name": "x", "recipients": [], "templates": {"subjct": "s"}}, "templates.subjct"),
        ({"name": " ", "recipients": [{"email": "a@example.com"}]}, "name"),
        ({"name": "x", "from": "not an address", "recipients": [{"email": "a@example.com"}]},
         "from"),
        ({"name": "x", "recipients": []}, "recipients"),
        ({"name": "x", "recipients": [{"email": "a@example.com"}],
          "templates": {"subject": "{{ oops"}}, "subject"),
    ],
)  # fmt: skip
def test_create_refuses_a_bad_json_field(web: Web, body: dict[str, Any], field: str) -> None:
    error = _error(web.client.post("/api/campaigns", json=body), 422)
    assert error["field"] == field
    _nothing_written(web)


def test_create_refuses_malformed_json_and_other_media_types(web: Web) -> None:
    error = _error(
        web.client.post(
            "/api/campaigns", content=b"{nope", headers={"content-type": "application/json"}
        ),
        422,
    )
    assert error["field"] == "body"
    _error(
        web.client.post("/api/campaigns", content=b"x", headers={"content-type": "text/csv"}), 415
    )
    _nothing_written(web)


def test_bad_csv_rows_are_listed_with_their_row_numbers(web: Web) -> None:
    csv = (
        b"email,name,subject,body\n"
        b"ok@example.com,Ok,S,B\n"
        b"not-an-address,Bad,S,B\n"
        b"\n"
        b"x@example.com,Bell\x07,S,B\n"
    )
    response = web.client.post(
        "/api/campaigns",
        data={**POLICY_FORM, "name": "rows"},
        files={"file": ("r.csv", csv, "text/csv")},
    )
    error = _error(response, 422)
    assert error["total"] == 2
    assert [(e["row"], e["field"]) for e in error["errors"]] == [(3, "email"), (5, "name")]
    assert all(e["reason"] for e in error["errors"])
    _nothing_written(web)


def test_bad_json_rows_count_the_first_recipient_as_row_2(web: Web) -> None:
    body = {
        "name": "rows",
        "recipients": [
            {"email": "ok@example.com"},
            {"email": "bad"},
            {"email": ["x@example.com"]},
            "not an object",
            {},
            {"email": "ok2@example.com", "name": "Bell\x07"},
        ],
        "templates": {"subject": "S", "body": "B"},
    }
    error = _error(web.client.post("/api/campaigns", json=body), 422)
    assert [(e["row"], e["field"]) for e in error["errors"]] == [
        (3, "email"),
        (4, "email"),
        (5, "row"),
        (6, "email"),
        (7, "name"),
    ]
    assert error["total"] == 5
    _nothing_written(web)


def test_form_errors_name_the_field(web: Web) -> None:
    files = {"file": ("r.csv", csv_bytes(1), "text/csv")}
    error = _error(
        web.client.post("/api/campaigns", data={**POLICY_FORM, "name": "x", "per_day": "many"},
                        files=files),
        422,
    )  # fmt: skip
    assert (error["field"], error["value"]) == ("per_day", "many")
    error = _error(
        web.client.post("/api/campaigns", data={**POLICY_FORM, "name": "x", "weekdays": ""},
                        files=files),
        422,
    )  # fmt: skip
    assert error["field"] == "weekdays"
    error = _error(web.client.post("/api/campaigns", data={"name": "x"}, files={"other": b""}), 422)
    assert error["field"] == "file"
    _nothing_written(web)


# -- upload limits -------------------------------------------------------------------------------


def test_413_when_content_length_says_too_large_before_reading_anything(web: Web) -> None:
    limit = web.container.settings.max_upload_bytes + BODY_OVERHEAD_BYTES
    app = create_app(web.container)
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        raise AssertionError("the body was read")

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/api/campaigns", "raw_path": b"/api/campaigns",
        "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
        "headers": [(b"content-type", b"multipart/form-data; boundary=x"),
                    (b"content-length", str(limit + 1).encode())],
    }  # fmt: skip
    anyio.run(app, scope, receive, send)
    assert sent[0]["status"] == 413
    assert b'"status":413' in sent[1]["body"]


def test_413_for_a_chunked_body_counting_bytes_and_reading_no_further(web: Web) -> None:
    limit = web.container.settings.max_upload_bytes + BODY_OVERHEAD_BYTES
    chunk = b"x" * 65536
    pulled = 0

    def body() -> Iterator[bytes]:
        yield b"--b\r\nContent-Disposition: form-data; name=file; filename=a.csv\r\n\r\n"
        while True:
            yield chunk

    # Through a real client: no Content-Length, so the middleware has to count.
    head = body()
    limited = (next(head) if i == 0 else chunk for i in range(limit // len(chunk) + 3))
    response = web.client.post(
        "/api/campaigns",
        content=limited,
        headers={"content-type": "multipart/form-data; boundary=b"},
    )
    assert "content-length" not in response.request.headers
    error = _error(response, 413)
    assert error["field"] == "file"

    # At the ASGI level: the app stops pulling the endless body just past the limit.
    app = create_app(web.container)
    sent: list[MutableMapping[str, Any]] = []
    stream = body()

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        data = next(stream)
        pulled += len(data)
        return {"type": "http.request", "body": data, "more_body": True}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/api/campaigns", "raw_path": b"/api/campaigns",
        "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
        "headers": [(b"content-type", b"multipart/form-data; boundary=b")],
    }  # fmt: skip
    anyio.run(app, scope, receive, send)
    assert sent[0]["status"] == 413
    assert limit < pulled <= limit + len(chunk) + 200


def test_413_for_a_csv_larger_than_the_upload_limit(make_web: Any) -> None:
    web = make_web(max_upload_bytes=2048)
    big = csv_bytes(200)
    assert len(big) > 2048
    response = web.client.post(
        "/api/campaigns",
        data={**POLICY_FORM, "name": "big"},
        files={"file": ("big.csv", big, "text/csv")},
    )
    assert _error(response, 413)["field"] == "file"
    _nothing_written(web)


# -- preview -------------------------------------------------------------------------------------


def test_preview_a_new_campaign_writes_nothing(web: Web) -> None:
    body = {
        "name": "p",
        "recipients": [{"email": f"p{i}@example.com"} for i in range(5)],
        "templates": {"subject": "S", "body": "B"},
        "policy": {"timezone": "Europe/Berlin", "per_day": 2, "weekdays": ["mon", "tue"],
                   "windows": ["09:00-12:00", "13:00-17:00"], "start": "2026-12-01T09:00"},
    }  # fmt: skip
    response = web.client.post("/api/campaigns/preview", json=body)
    assert response.status_code == 200, response.text
    data = response.json()
    assert (
        data["policy_text"]
        == "2 a day, Mon, Tue, 09:00\u201312:00 and 13:00\u201317:00, Europe/Berlin"
    )
    assert (data["timezone"], data["count"], data["duplicates"]) == ("Europe/Berlin", 5, 0)
    assert data["sends"][0] == {
        "index": 0,
        "send_at": "2026-12-01T08:00:00Z",
        "local": "2026-12-01T09:00:00+01:00",
        "email": "p0@example.com",
        "zone": "Europe/Berlin",
        "sender": "sendqueue@example.com",  # no senders: the default From
    }
    assert data["zone_names"] == {"Europe/Berlin": {"60": "CET", "120": "CEST"}}
    assert [(d["day"], d["count"]) for d in data["days"]] == [
        ("2026-12-01", 2), ("2026-12-07", 2), ("2026-12-08", 1),
    ]  # fmt: skip
    assert data["days"][0]["first"] == "2026-12-01T09:00:00+01:00"
    _nothing_written(web)

    form = web.client.post(
        "/api/campaigns/preview",
        data={**POLICY_FORM, "name": "p"},
        files={"file": ("p.csv", csv_bytes(4) + b"user0@example.com,x,y,z\n", "text/csv")},
    ).json()
    assert (form["count"], form["duplicates"]) == (4, 1)
    _nothing_written(web)


def test_preview_a_stored_campaign(web: Web) -> None:
    cid = web.create(3)["id"]
    data = web.client.get(f"/api/campaigns/{cid}/preview").json()
    assert data["count"] == 3
    assert [s["email"] for s in data["sends"]] == [f"user{i}@example.com" for i in range(3)]
    # 10,000 a day over the whole day: a slot every 8.64 s, the first after 08:00:00
    assert data["sends"][0]["send_at"] == "2026-12-01T08:00:05.760000Z"
    assert _error(web.client.get("/api/campaigns/nope/preview"), 404)


# -- read ---------------------------------------------------------------------------------------


def test_get_campaign_has_a_timeline_that_follows_the_sends(web: Web) -> None:
    draft = web.create(3)
    got = web.client.get(f"/api/campaigns/{draft['id']}").json()
    assert got["timeline"] == [{"day": "2026-12-01", "planned": 3, "done": 0}]
    cid = web.active(3)
    data = web.client.get(f"/api/campaigns/{cid}").json()
    assert data["state"] == "active"
    assert data["next_send_at"] == "2026-12-01T08:00:05.760000Z"
    assert data["timeline"] == [{"day": "2026-12-01", "planned": 3, "done": 0}]
    web.clock.advance(60)
    assert web.fire_due() == 3
    data = web.client.get(f"/api/campaigns/{cid}").json()
    assert data["state"] == "completed"
    assert data["counts"]["Finished"] == 3
    assert data["next_send_at"] is None
    assert data["timeline"] == [{"day": "2026-12-01", "planned": 3, "done": 3}]
    campaign = web.container.store.get_campaign(cid)
    assert data["timeline"] == campaign_timeline(web.container.store, campaign, web.clock.now())


def test_unknown_ids_are_404(web: Web) -> None:
    for method, path in [
        ("GET", "/api/campaigns/nope"),
        ("GET", "/api/campaigns/nope/tasks"),
        ("GET", "/api/campaigns/nope/events"),
        ("POST", "/api/campaigns/nope/provision"),
        ("POST", "/api/campaigns/nope/pause"),
        ("POST", "/api/campaigns/nope/resume"),
        ("POST", "/api/campaigns/nope/cancel"),
        ("POST", "/api/campaigns/nope/retry-failed"),
        ("POST", "/api/campaigns/nope/tasks/nope-1/cancel"),
        ("POST", "/api/dead-letters/nope/redrive"),
    ]:
        error = _error(web.client.request(method, path), 404)
        assert "not found" in error["message"]


def test_tasks_page_with_a_cursor_a_state_filter_and_a_search(web: Web) -> None:
    cid = web.active(7)
    seen: list[int] = []
    cursor: int | None = -1
    pages = 0
    while cursor is not None:
        page = web.client.get(f"/api/campaigns/{cid}/tasks", params={"limit": 3, "after": cursor})
        data = page.json()
        seen += [t["position"] for t in data["tasks"]]
        cursor = data["next"]
        pages += 1
    assert seen == list(range(7))
    assert pages == 3
    task_id = f"{cid}-4"
    assert web.client.post(f"/api/campaigns/{cid}/tasks/{task_id}/cancel").status_code == 200
    cancelled = web.client.get(f"/api/campaigns/{cid}/tasks", params={"state": "cancelled"})
    assert [t["id"] for t in cancelled.json()["tasks"]] == [task_id]
    assert cancelled.json()["next"] is None
    field = _error(web.client.get(f"/api/campaigns/{cid}/tasks", params={"state": "Lost"}), 422)
    assert field["field"] == "state"
    for bad in ({"limit": 0}, {"limit": 501}, {"after": -2}):
        error = _error(web.client.get(f"/api/campaigns/{cid}/tasks", params=bad), 422)
        assert error["field"] == next(iter(bad))


def test_search_matches_percent_and_underscore_literally(web: Web) -> None:
    emails = ["x_1@example.com", "xa1@example.com", "y%2@example.com", "yb2@example.com"]
    data = web.create(recipients=[{"email": e} for e in emails])
    cid = data["id"]
    assert web.container.provisioner.provision(cid).status == "done"

    def search(text: str) -> list[str]:
        response = web.client.get(f"/api/campaigns/{cid}/tasks", params={"search": text})
        return [t["email"] for t in response.json()["tasks"]]

    assert search("x_1") == ["x_1@example.com"]
    assert search("_") == ["x_1@example.com"]
    assert search("%") == ["y%2@example.com"]
    assert search("Y%2@") == ["y%2@example.com"]
    assert search("1@EXAMPLE") == ["x_1@example.com", "xa1@example.com"]


# -- controls ------------------------------------------------------------------------------------


def test_provision_answers_202_and_the_campaign_becomes_active(web: Web) -> None:
    cid = web.create(5)["id"]
    response = web.client.post(f"/api/campaigns/{cid}/provision")
    assert response.status_code == 202
    assert response.json()["state"] == "provisioning"
    wait_until(lambda: web.client.get(f"/api/campaigns/{cid}").json()["state"] == "active", 20)
    data = web.client.get(f"/api/campaigns/{cid}").json()
    assert data["counts"]["Pending"] == 5
    assert data["checkpoint"]["phase"] == "done"
    assert _error(web.client.post(f"/api/campaigns/{cid}/provision"), 409)


def test_pause_resume_cancel_and_the_409s(web: Web) -> None:
    draft = web.create(2)["id"]
    assert (
        "cannot go from draft"
        in _error(web.client.post(f"/api/campaigns/{draft}/pause"), 409)["message"]
    )
    cid = web.active(3)
    paused = web.client.post(f"/api/campaigns/{cid}/pause")
    assert paused.status_code == 200
    assert paused.json()["state"] == "paused"
    assert paused.json()["next_send_at"] is None
    _error(web.client.post(f"/api/campaigns/{cid}/pause"), 409)
    resumed = web.client.post(f"/api/campaigns/{cid}/resume")
    assert resumed.json()["state"] == "active"
    assert resumed.json()["counts"]["Pending"] == 3
    cancelled = web.client.post(f"/api/campaigns/{cid}/cancel")
    assert cancelled.json()["state"] == "cancelled"
    assert cancelled.json()["counts"]["Cancelled"] == 3
    error = _error(web.client.post(f"/api/campaigns/{cid}/resume"), 409)
    assert "cancelled" in error["message"]


def test_cancel_one_task(web: Web) -> None:
    cid = web.active(3)
    other = web.active(1)
    task_id = f"{cid}-1"
    response = web.client.post(f"/api/campaigns/{cid}/tasks/{task_id}/cancel")
    assert response.status_code == 200
    assert response.json()["state"] == "Cancelled"
    assert response.json()["id"] == task_id
    error = _error(web.client.post(f"/api/campaigns/{cid}/tasks/{task_id}/cancel"), 409)
    assert "Cancelled" in error["message"]
    _error(web.client.post(f"/api/campaigns/{other}/tasks/{task_id}/cancel"), 404)


def test_retry_failed_sends_the_failed_ones_again(web: Web) -> None:
    cid = web.active(3)
    web.mailer.fail_next(*(PermanentMailError("550 5.1.1 no such user") for _ in range(2)))
    web.clock.advance(60)
    web.fire_due()
    data = web.client.get(f"/api/campaigns/{cid}").json()
    assert (data["counts"]["Failed"], data["counts"]["Finished"]) == (2, 1)
    assert data["state"] == "completed"
    retried = web.client.post(f"/api/campaigns/{cid}/retry-failed")
    assert retried.status_code == 200
    assert retried.json()["affected"] == 2
    assert retried.json()["state"] == "active"
    assert retried.json()["counts"]["Pending"] == 2
    web.clock.advance(60)
    web.fire_due()
    assert web.client.get(f"/api/campaigns/{cid}").json()["counts"]["Finished"] == 3
    draft = web.create(1)["id"]
    _error(web.client.post(f"/api/campaigns/{draft}/retry-failed"), 409)


# -- dead letters --------------------------------------------------------------------------------


def test_dead_letters_list_and_redrive(web: Web) -> None:
    assert web.client.get("/api/dead-letters").json() == {"dead_letters": []}
    _dead_letter(web, "sq-test-1")
    letters = web.client.get("/api/dead-letters").json()["dead_letters"]
    assert len(letters) == 1
    letter = letters[0]
    assert set(letter) == {"id", "schedule", "group", "payload", "error", "attempts", "failed_at"}
    assert (letter["schedule"], letter["group"], letter["payload"]) == (
        "sq-test-1", "sq-test", {"kind": "test"},
    )  # fmt: skip
    assert "boom" in letter["error"]
    response = web.client.post(f"/api/dead-letters/{letter['id']}/redrive")
    assert response.json() == {
        "redriven": [letter["id"]],
        "schedules": ["sq-test-1"],
        "skipped": [],
        "failed_again": [],
    }
    assert web.client.get("/api/dead-letters").json() == {"dead_letters": []}
    assert web.container.scheduler.get("sq-test-1") is not None
    web.container.scheduler.delete("sq-test-1")  # or it fails again with the next ones

    _dead_letter(web, "sq-test-2")
    _dead_letter(web, "sq-test-3")
    ids = [d["id"] for d in web.client.get("/api/dead-letters").json()["dead_letters"]]
    response = web.client.post("/api/dead-letters/redrive")
    assert response.json() == {
        "redriven": ids,
        "schedules": ["sq-test-2", "sq-test-3"],
        "skipped": [],
        "failed_again": [],
    }
    assert web.client.post("/api/dead-letters/redrive").json() == {
        "redriven": [],
        "schedules": [],
        "skipped": [],
        "failed_again": [],
    }


# -- the store is down ---------------------------------------------------------------------------


def test_503_with_retry_after_when_the_store_is_unreachable(make_web: Any) -> None:
    web = make_web(flaky=True)
    cid = web.create(1)["id"]
    web.store.down = True
    for method, path in [
        ("GET", "/api/campaigns"),
        ("GET", f"/api/campaigns/{cid}"),
        ("GET", f"/api/campaigns/{cid}/tasks"),
        ("POST", f"/api/campaigns/{cid}/pause"),
        ("GET", f"/api/campaigns/{cid}/events"),
    ]:
        response = web.client.request(method, path)
        error = _error(response, 503)
        assert response.headers["retry-after"] == "5"
        assert "StoreUnavailable" in error["message"]
    web.store.error_text = "connection to db.internal:5432 as user admin refused"
    health = web.client.get("/healthz")
    assert health.status_code == 503
    assert health.json()["status"] == "unavailable"
    # public: no driver text (hosts, users) in the body
    assert "db.internal" not in health.text and "StoreUnavailable" not in health.text
    assert health.headers["retry-after"] == "5"
    web.store.down = False
    assert web.client.get("/healthz").json() == {"status": "ok"}


class _BrokenScheduler:
    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise SchedulerError("injected: the execution layer is unreachable")

        return fail


def test_503_when_the_execution_layer_fails(web: Web) -> None:
    web.container.__dict__["scheduler"] = _BrokenScheduler()
    response = web.client.get("/api/dead-letters")
    assert "SchedulerError" in _error(response, 503)["message"]
    assert response.headers["retry-after"] == "5"
    assert _error(web.client.post("/api/dead-letters/redrive"), 503)
    # the metrics still render; only the dead-letter depth is unknown
    assert web.client.get("/metrics").status_code == 200


def test_events_refuse_a_bad_last_event_id(web: Web) -> None:
    cid = web.create(1)["id"]
    response = web.client.get(f"/api/campaigns/{cid}/events", headers={"Last-Event-ID": "abc"})
    assert _error(response, 422)["field"] == "Last-Event-ID"


# -- recipients as rows (the service function behind the JSON body) -------------------------------


def test_parse_recipient_rows_follows_the_csv_rules() -> None:
    result = parse_recipient_rows(
        [
            {"email": " Ada@Example.com ", "name": "Ada", "city": "Paris"},
            {"email": "ada@example.com", "name": "Duplicate"},
            {"email": "bob@example.com", "subject": "Own subject", "score": 1.5},
        ],
        templates=Templates(subject="Hi {{ name }} in {{ city }}", body="Score {{ score }}"),
    )
    assert [r.email for r in result.recipients] == ["Ada@example.com", "bob@example.com"]
    assert (result.rows, result.duplicates, result.duplicate_rows) == (3, 1, [3])
    ada, bob = result.recipients
    assert (ada.subject, ada.text, ada.variables) == (
        "Hi Ada in Paris", "Score ", {"city": "Paris", "score": ""},
    )  # fmt: skip
    assert (bob.subject, bob.text) == ("Own subject", "Score 1.5")


def test_parse_recipient_rows_refuses_bad_input_as_a_whole() -> None:
    with pytest.raises(InvalidField) as empty:
        parse_recipient_rows([], templates=Templates(subject="s", body="b"))
    assert empty.value.field == "recipients"
    with pytest.raises(InvalidField) as clash:
        parse_recipient_rows(
            [{"email": "a@example.com", "Name": "A", "name": "B"}],
            templates=Templates(subject="s", body="b"),
        )
    assert clash.value.field == "recipients"
    assert "repeats" in clash.value.reason
    with pytest.raises(InvalidInput) as rows:
        parse_recipient_rows(
            [{"email": "x"} for _ in range(5)], templates=Templates(subject="s", body="b"),
            max_errors=2,
        )  # fmt: skip
    assert (len(rows.value.errors), rows.value.total) == (2, 5)
    assert [e.row for e in rows.value.errors] == [2, 3]
    assert str(rows.value).startswith("5 of 5 rows are invalid")


def test_created_at_is_the_clock_time(web: Web) -> None:
    data = web.create(1)
    assert datetime.fromisoformat(data["created_at"].replace("Z", "+00:00")) == T0.astimezone(UTC)


def test_cursors_beyond_64_bits_are_a_422_not_a_500(web: Web) -> None:
    huge = str(2**63)
    tasks = web.client.get("/api/campaigns/cany/tasks", params={"after": huge})
    assert tasks.status_code == 422 and tasks.json()["error"]["field"] == "after"
    events = web.client.get("/api/campaigns/cany/events", headers={"Last-Event-ID": huge})
    assert events.status_code == 422 and events.json()["error"]["field"] == "Last-Event-ID"


def test_a_json_body_over_its_limit_is_refused_before_parsing(make_web: Any) -> None:
    web: Web = make_web(max_json_body_bytes=4096)
    body = {
        "name": "big",
        "recipients": [{"email": f"user{i}@example.com"} for i in range(500)],
        "templates": {"subject": "Hi", "body": "Hello"},
    }
    for path in ("/api/campaigns", "/api/campaigns/preview"):
        error = _error(web.client.post(path, json=body), 413)
        assert error["field"] == "body"
        assert "SENDQUEUE_MAX_JSON_BODY_BYTES" in error["message"]
        assert "CSV" in error["message"]
    _nothing_written(web)
    # Under the limit the same route still works.
    web.create(count=3)


def test_moves_late_sends_and_paused_emails_show_in_the_api_and_the_page(web: Web) -> None:
    policy = {"timezone": "UTC", "per_day": 100, "weekdays": "mon-sun", "windows": ["00:00-24:00"]}
    cid = web.create(4, policy=policy)["id"]  # one every 14.4 minutes
    assert web.container.provisioner.provision(cid).status == "done"
    planned = {t["id"]: t["send_at"] for t in web.client.get(f"/api/campaigns/{cid}/tasks")
               .json()["tasks"]}  # fmt: skip
    first = min(datetime.fromisoformat(s) for s in planned.values())
    # the schedules fire 400 s late (SENDQUEUE_MAX_LATENESS is 300): all four move; no worker
    # start was seen, so the reason is a late fire, from the first send time to now, in UTC
    web.clock.set(first + timedelta(seconds=400))
    web.fire_due()
    tasks = web.client.get(f"/api/campaigns/{cid}/tasks").json()["tasks"]
    reason = f"fired late {utc_span(first, first + timedelta(seconds=400))}"
    assert all(t["moves"] == 1 and t["moved_reason"] == reason for t in tasks)
    assert [t["planned_at"] for t in tasks] == [planned[t["id"]] for t in tasks]
    assert all(t["send_at"] > t["planned_at"] for t in tasks)
    # the first goes out 90 s after its new send time (late), the others wait
    moved_to = datetime.fromisoformat(tasks[0]["send_at"])
    web.clock.set(moved_to + timedelta(seconds=90))
    web.fire_due()
    detail = web.client.get(f"/api/campaigns/{cid}").json()
    assert (detail["moved"], detail["late"]) == (4, 1)
    tasks = web.client.get(f"/api/campaigns/{cid}/tasks").json()["tasks"]
    assert tasks[0]["state"] == "Finished" and tasks[0]["late"] is True
    assert not any(t["late"] for t in tasks[1:])

    assert web.client.post(f"/api/campaigns/{cid}/pause").status_code == 200
    tasks = web.client.get(f"/api/campaigns/{cid}/tasks").json()["tasks"]
    assert [(t["state"], t["paused"], t["send_at"] is None) for t in tasks] == [
        ("Finished", False, False)
    ] + [("Pending", True, True)] * 3
    page = web.client.get(f"/campaigns/{cid}").text
    assert page.count('datetime=""><span class="nowrap">paused</span></time>') == 3
    assert "(late)</time>" in page
    assert '<dd id="campaign-moved"' in page and ">4</dd>" in page
    assert f"1 move: {reason}" in page
