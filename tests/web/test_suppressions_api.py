"""``/api/suppressions`` on real SQLite files: shapes, errors naming the field or the rows, the
CSV import and export, CSRF like every other write, and the suppressed count on a campaign."""

from __future__ import annotations

from typing import Any

from tests.web.conftest import Web
from tests.web.test_api import _error


def _add(web: Web, email: str, reason: str = "manual", status: int = 201) -> dict[str, Any]:
    response = web.client.post("/api/suppressions", json={"email": email, "reason": reason})
    assert response.status_code == status, response.text
    data: dict[str, Any] = response.json()
    return data


def test_add_list_page_and_remove(web: Web) -> None:
    added = _add(web, "Ada@Example.com", "bounced")
    assert added == {
        "email": "ada@example.com", "reason": "bounced", "task_id": None,
        "at": "2026-12-01T08:00:00Z", "new": True,
    }  # fmt: skip
    kept = _add(web, "ADA@example.com", "manual", status=200)
    assert (kept["reason"], kept["new"]) == ("bounced", False)
    for i in range(4):
        _add(web, f"u{i}@example.com")

    first = web.client.get("/api/suppressions", params={"limit": 3}).json()
    assert [e["email"] for e in first["suppressions"]] == [
        "ada@example.com", "u0@example.com", "u1@example.com",
    ]  # fmt: skip
    assert (first["total"], first["next"]) == (5, "u1@example.com")
    rest = web.client.get("/api/suppressions", params={"limit": 3, "after": first["next"]}).json()
    assert [e["email"] for e in rest["suppressions"]] == ["u2@example.com", "u3@example.com"]
    assert rest["next"] is None

    removed = web.client.delete("/api/suppressions/U0@example.com")
    assert removed.status_code == 200 and removed.json() == {"removed": "u0@example.com"}
    assert _error(web.client.delete("/api/suppressions/u0@example.com"), 404)
    assert web.client.get("/api/suppressions").json()["total"] == 4
    # a local part may hold a slash, escaped or not
    _add(web, "a/b@example.com")
    gone = web.client.delete("/api/suppressions/a%2Fb@example.com")
    assert gone.status_code == 200 and gone.json() == {"removed": "a/b@example.com"}
    _add(web, "a/b@example.com")
    assert web.client.delete("/api/suppressions/a/b@example.com").status_code == 200


def test_the_page_counts_the_addresses_in_words(web: Web) -> None:
    _add(web, "ada@example.com")
    assert '"1">1 address</span> listed.' in web.client.get("/suppressions").text
    _add(web, "bob@example.com")
    assert '"2">2 addresses</span> listed.' in web.client.get("/suppressions").text


def test_bad_input_is_a_422_naming_the_field(web: Web) -> None:
    bad = web.client.post("/api/suppressions", json={"email": "not-an-address"})
    assert _error(bad, 422)["field"] == "email"
    reason = web.client.post("/api/suppressions", json={"email": "a@example.com", "reason": "x"})
    assert _error(reason, 422)["field"] == "reason"
    extra = web.client.post("/api/suppressions", json={"email": "a@example.com", "to": 1})
    assert _error(extra, 422)
    assert _error(web.client.delete("/api/suppressions/nope"), 422)["field"] == "email"
    assert _error(web.client.get("/api/suppressions", params={"limit": 0}), 422)
    assert web.client.get("/api/suppressions").json()["total"] == 0


def test_import_reports_every_bad_row_and_imports_nothing(web: Web) -> None:
    text = b"email,reason\nok@example.com,bounced\nnope,manual\nb@example.com,spam\n"
    response = web.client.post(
        "/api/suppressions/import", files={"file": ("s.csv", text, "text/csv")}
    )
    body = _error(response, 422)
    assert [(e["row"], e["field"]) for e in body["errors"]] == [(3, "email"), (4, "reason")]
    assert web.client.get("/api/suppressions").json()["total"] == 0
    not_csv = web.client.post(
        "/api/suppressions/import", files={"file": ("s.csv", b"\xff\xfe", "text/csv")}
    )
    assert _error(not_csv, 422)["field"] == "file"
    plain = web.client.post(
        "/api/suppressions/import", content=b"email\na@example.com\n",
        headers={"Content-Type": "text/csv"},
    )  # fmt: skip
    assert _error(plain, 415)
    no_file = web.client.post("/api/suppressions/import", data={"x": "1"}, files={"y": ("a", b"")})
    assert _error(no_file, 422)["field"] == "file"


def test_an_upload_is_checked_whole_before_anything_is_imported(make_web: Any) -> None:
    web = make_web()
    good = b"".join(b"u%d@example.com,bounced\n" % i for i in range(2_000))
    late = web.client.post(
        "/api/suppressions/import",
        files={"file": ("s.csv", b"email,reason\n" + good + b"caf\xe9@example.com,\n", "text/csv")},
    )
    error = _error(late, 422)
    assert error["field"] == "file" and error["reason"].startswith("not UTF-8: invalid byte 0xe9")
    assert web.client.get("/api/suppressions").json()["total"] == 0
    small = make_web(max_upload_bytes=2048)
    big = small.client.post(
        "/api/suppressions/import", files={"file": ("s.csv", b"email\n" + good, "text/csv")}
    )
    assert _error(big, 413)["field"] == "file"
    assert small.client.get("/api/suppressions").json()["total"] == 0


def test_formula_cells_are_exported_quoted_and_import_back(web: Web) -> None:
    text = b"email,task_id\n'-x@example.com,'=HYPERLINK(\"http://e.example\")\n+y@example.com,\n"
    response = web.client.post(
        "/api/suppressions/import", files={"file": ("s.csv", text, "text/csv")}
    )
    assert response.json() == {"rows": 2, "added": 2, "kept": 0}
    listed = web.client.get("/api/suppressions").json()["suppressions"]
    assert [(e["email"], e["task_id"]) for e in listed] == [
        ("+y@example.com", None),
        ("-x@example.com", '=HYPERLINK("http://e.example")'),
    ]
    export = web.client.get("/api/suppressions/export").text
    assert export.splitlines()[1:] == [
        "'+y@example.com,manual,,2026-12-01T08:00:00Z",
        '\'-x@example.com,manual,"\'=HYPERLINK(""http://e.example"")",2026-12-01T08:00:00Z',
    ]


def test_import_then_export_round_trips(web: Web) -> None:
    text = b"email,reason,name\nB@example.com,complained,Bea\na@example.com,,Al\n"
    response = web.client.post(
        "/api/suppressions/import", files={"file": ("s.csv", text, "text/csv")}
    )
    assert response.status_code == 200, response.text
    assert response.json() == {"rows": 2, "added": 2, "kept": 0}
    export = web.client.get("/api/suppressions/export")
    assert export.status_code == 200
    assert export.headers["content-type"].startswith("text/csv")
    assert export.text == (
        "email,reason,task_id,at\n"
        "a@example.com,manual,,2026-12-01T08:00:00Z\n"
        "b@example.com,complained,,2026-12-01T08:00:00Z\n"
    )
    again = web.client.post(
        "/api/suppressions/import", files={"file": ("s.csv", export.content, "text/csv")}
    )
    assert again.json() == {"rows": 2, "added": 0, "kept": 2}


def test_writes_need_the_csrf_token_from_a_browser(web: Web) -> None:
    browser = {"Origin": "http://testserver"}
    forged = web.client.post("/api/suppressions", json={"email": "a@example.com"}, headers=browser)
    assert forged.status_code == 403
    assert web.client.delete("/api/suppressions/a@example.com", headers=browser).status_code == 403
    upload = web.client.post(
        "/api/suppressions/import", headers=browser,
        files={"file": ("s.csv", b"email\na@example.com\n", "text/csv")},
    )  # fmt: skip
    assert upload.status_code == 403
    assert web.client.get("/api/suppressions").json()["total"] == 0
    csrf = web.client.cookies["sq_csrf"]
    ok = web.client.post(
        "/api/suppressions", json={"email": "a@example.com"},
        headers={**browser, "X-CSRF-Token": csrf},
    )  # fmt: skip
    assert ok.status_code == 201


def test_a_campaign_counts_its_suppressed_emails(web: Web) -> None:
    _add(web, "user1@example.com", "unsubscribed")
    cid = web.active(3)
    campaign = web.client.get(f"/api/campaigns/{cid}").json()
    assert campaign["suppressed"] == 1
    assert campaign["counts"]["Cancelled"] == 1
    listed = web.client.get("/api/campaigns").json()["campaigns"]
    assert [c["suppressed"] for c in listed] == [1]
    tasks = web.client.get(f"/api/campaigns/{cid}/tasks").json()["tasks"]
    assert [t["reason"] for t in tasks] == [None, "suppressed: unsubscribed", None]
    # suppressed after provisioning: cancelled at its send time, never sent
    _add(web, "user2@example.com", "bounced")
    web.clock.advance(seconds=60)  # past every send time, not yet overdue
    web.fire_due()
    assert [m.to_addr for m in web.mailer.sent] == ["user0@example.com"]
    assert web.client.get(f"/api/campaigns/{cid}").json()["suppressed"] == 2
