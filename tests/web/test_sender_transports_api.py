"""``/api/senders``: a sender's mailbox, signature and OAuth grant round-trip with their
secrets masked in every response, and the transport rules (no maildir: in production, no
password in plain text to another host, SENDQUEUE_TRANSPORT_HOSTS) refuse a write naming the
field, with nothing added or changed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from tests.web.conftest import Web
from tests.web.test_api import _error

SECRET = "hunter2-very-secret"
REFRESH = "1//refresh-token-Zq8"
CLIENT_SECRET = "client-secret-Wx4"
IMAP = f"imaps://anna:{SECRET}@imap.example.com/INBOX"
GRANT = {
    "token_url": "https://oauth2.example.com/token",
    "client_id": "client-42",
    "refresh_token": REFRESH,
    "client_secret": CLIENT_SECRET,
}
_TOKEN = "transport-rules-7Qe2-Lm9x"
_AUTH = {"Authorization": f"Bearer {_TOKEN}"}


def _clean(text: str) -> None:
    for secret in (SECRET, REFRESH, CLIENT_SECRET):
        assert secret not in text, text


def _stored(web: Web) -> list[Any]:
    return web.container.sender_store.list_senders()


def test_mailbox_signature_and_grant_round_trip_masked(web: Web) -> None:
    body = {
        "email": "anna@example.com",
        "imap": IMAP,
        "signature_text": "Anna\nSales",
        "signature_html": "<p>Anna</p>",
        "oauth": GRANT,
    }
    added = web.client.post("/api/senders", json=body)
    assert added.status_code == 201, added.text
    _clean(added.text)
    sid = added.json()["id"]
    shown = web.client.get(f"/api/senders/{sid}")
    _clean(shown.text)
    view = shown.json()
    assert view["imap"] == "imaps://anna:***@imap.example.com/INBOX"
    assert (view["signature_text"], view["signature_html"]) == ("Anna\nSales", "<p>Anna</p>")
    assert view["oauth"] == {
        "token_url": "https://oauth2.example.com/token",
        "client_id": "client-42",
        "scope": None,
        "refresh_token": "***",
        "client_secret": "***",
    }
    stored = web.container.sender_store.get_sender(sid)
    assert stored.imap == IMAP and stored.oauth is not None
    assert (stored.oauth.refresh_token, stored.oauth.client_secret) == (REFRESH, CLIENT_SECRET)

    page = web.client.get("/senders").text
    _clean(page)
    assert "imaps://anna:***@imap.example.com/INBOX" in page and "text and HTML" in page
    assert "client-42" in page and "refresh token stored" in page

    # a PATCH of one grant field keeps the others; null clears each optional field
    patched = web.client.patch(f"/api/senders/{sid}", json={"oauth": {"refresh_token": "new-1"}})
    assert patched.status_code == 200, patched.text
    grant = web.container.sender_store.get_sender(sid).oauth
    assert grant is not None and (grant.refresh_token, grant.client_id) == ("new-1", "client-42")
    assert grant.client_secret == CLIENT_SECRET
    cleared = web.client.patch(
        f"/api/senders/{sid}",
        json={"imap": None, "oauth": None, "signature_text": None, "signature_html": None},
    )
    assert cleared.status_code == 200, cleared.text
    keys = ("imap", "oauth", "signature_text", "signature_html")
    assert {k: cleared.json()[k] for k in keys} == {
        "imap": None,
        "oauth": None,
        "signature_text": "",
        "signature_html": None,
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"oauth": {**GRANT, "token_url": "ftp://x"}}, "oauth.token_url"),
        ({"oauth": {**GRANT, "refresh_token": ""}}, "oauth.refresh_token"),
        ({"oauth": {**GRANT, "password": SECRET}}, "oauth.password"),
        ({"oauth": {**GRANT, "refresh_token": 12}}, "oauth.refresh_token"),
        ({"oauth": {"client_secret": CLIENT_SECRET, "refresh_token": REFRESH}}, "oauth.token_url"),
        ({"imap": f"imaps://anna:{SECRET}/x@imap.example.com/INBOX"}, "imap"),
        ({"imap": f"pop3://anna:{SECRET}@pop.example.com"}, "imap"),
        ({"signature_html": "x" * 20_001}, "signature_html"),
    ],
)
def test_a_bad_mailbox_or_grant_is_a_422_naming_it_quoting_no_secret(
    web: Web, body: dict[str, Any], field: str
) -> None:
    response = web.client.post("/api/senders", json={"email": "anna@example.com", **body})
    assert _error(response, 422)["field"] == field
    _clean(response.text)
    assert _stored(web) == []


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (
            {"transport": f"smtp://anna:{SECRET}@smtp.example.com:25?security=none"},
            "transport",
            "unencrypted to smtp.example.com:25",
        ),
        (
            {"imap": f"imap://anna:{SECRET}@imap.example.com/INBOX?security=none"},
            "imap",
            "unencrypted to imap.example.com:143",
        ),
    ],
)
def test_a_password_in_plain_text_to_another_host_is_refused(
    web: Web, body: dict[str, Any], field: str, words: str
) -> None:
    response = web.client.post("/api/senders", json={"email": "anna@example.com", **body})
    error = _error(response, 422)
    assert error["field"] == field and words in error["reason"]
    _clean(response.text)
    assert _stored(web) == []
    # this machine may take one: a local relay, the tests' own servers
    local = {key: value.replace("@smtp.example.com", "@127.0.0.1") for key, value in body.items()}
    local = {key: value.replace("@imap.example.com", "@localhost") for key, value in local.items()}
    assert web.client.post("/api/senders", json={"email": "b@example.com", **local}).is_success


def test_a_grant_whose_token_endpoint_is_plain_http_to_another_host_is_refused(web: Web) -> None:
    grant = {**GRANT, "token_url": "http://oauth2.example.com/token"}
    response = web.client.post("/api/senders", json={"email": "anna@example.com", "oauth": grant})
    assert _error(response, 422)["field"] == "oauth.token_url"
    _clean(response.text)
    assert _stored(web) == []
    local = {**GRANT, "token_url": "http://127.0.0.1:8080/token"}  # a local endpoint: the tests'
    assert web.client.post(
        "/api/senders", json={"email": "b@example.com", "oauth": local}
    ).is_success


def test_hosts_outside_the_allow_list_are_refused_naming_the_field_and_host(
    make_web: Callable[..., Web],
) -> None:
    web = make_web(transport_hosts="*.mail.example.com, smtp.partner.org")
    allowed = {
        "transport": f"smtp://anna:{SECRET}@out.mail.example.com:587",
        "imap": f"imaps://anna:{SECRET}@smtp.partner.org/INBOX",
    }
    added = web.client.post("/api/senders", json={"email": "anna@example.com", **allowed})
    assert added.status_code == 201, added.text
    sid = added.json()["id"]
    before = web.container.sender_store.get_sender(sid)
    for field, url, host in [
        ("transport", f"smtp://anna:{SECRET}@mail.example.com:587", "mail.example.com"),
        ("imap", f"imaps://anna:{SECRET}@imap.evil.example/INBOX", "imap.evil.example"),
    ]:
        new = web.client.post("/api/senders", json={"email": "bob@example.com", field: url})
        error = _error(new, 422)
        assert error["field"] == field and host in error["reason"], error
        _clean(new.text)
        changed = web.client.patch(f"/api/senders/{sid}", json={field: url})
        assert _error(changed, 422)["field"] == field
        _clean(changed.text)
    assert web.container.sender_store.get_sender(sid) == before
    assert [s.email for s in _stored(web)] == ["anna@example.com"]


def test_production_refuses_a_maildir_transport_on_add_and_update(
    make_web: Callable[..., Web], tmp_path: Any
) -> None:
    web = make_web(
        environment="production",
        mailer="smtp://127.0.0.1:2525",
        api_token=_TOKEN,
        public_url="https://mail.example.com",
        secret_key="transport-rules-secret-0123456789abcdef",
    )
    refused = web.client.post(
        "/api/senders",
        json={"email": "anna@example.com", "transport": f"maildir:{tmp_path / 'out'}"},
        headers=_AUTH,
    )
    error = _error(refused, 422)
    assert error["field"] == "transport" and "maildir:" in error["reason"]
    assert _stored(web) == []
    added = web.client.post("/api/senders", json={"email": "anna@example.com"}, headers=_AUTH)
    sid = added.json()["id"]
    changed = web.client.patch(
        f"/api/senders/{sid}", json={"transport": "maildir:/tmp/out"}, headers=_AUTH
    )
    assert _error(changed, 422)["field"] == "transport"
    assert web.container.sender_store.get_sender(sid).transport is None
    assert not (tmp_path / "out").exists()


def test_a_stored_maildir_transport_fails_its_sends_in_production(
    make_web: Callable[..., Web], tmp_path: Any
) -> None:
    """A sender stored before the rules held (a maildir: transport, then production): its
    emails fail with a clear error, and no file is written."""
    web = make_web(
        environment="production",
        mailer="smtp://127.0.0.1:2525",
        api_token=_TOKEN,
        public_url="https://mail.example.com",
        secret_key="transport-rules-secret-0123456789abcdef",
    )
    web.client.headers.update(_AUTH)
    sid = web.client.post("/api/senders", json={"email": "anna@example.com"}).json()["id"]
    outbox = tmp_path / "outbox-of-a-sender"
    store = web.container.sender_store
    store.update_sender(replace(store.get_sender(sid), transport=f"maildir:{outbox}"))
    cid = web.create(2, senders=[sid])["id"]
    assert web.container.provisioner.provision(cid).status == "done"
    for _ in range(3):  # a minute apart: the sender's gap
        web.clock.advance(minutes=1)
        web.fire_due()
    tasks = web.client.get(f"/api/campaigns/{cid}/tasks").json()["tasks"]
    assert [t["state"] for t in tasks] == ["Failed", "Failed"], tasks
    for task in tasks:
        assert "maildir:" in task["error"] and "delivers nothing" in task["error"], task
    assert web.mailer.sent == [] and not outbox.exists()


@pytest.mark.parametrize("special", ["/", "?", "#", "@", ":", "%zz", "[", "]", "/x?y#z@"])
def test_no_422_quotes_a_password_whatever_it_holds(web: Web, special: str) -> None:
    password = f"pw-{special}-Qv9"
    for field, url in [
        ("transport", f"smtp://anna:{password}@smtp.example.com:587"),
        ("imap", f"imaps://anna:{password}@imap.example.com/INBOX"),
    ]:
        for body in ({"email": "anna@example.com", field: url}, {field: url}):
            response = web.client.post("/api/senders", json=body)
            assert response.status_code in (201, 422), response.text
            assert "Qv9" not in response.text and password not in response.text, response.text
            if response.status_code == 201:
                assert web.client.delete(f"/api/senders/{response.json()['id']}").is_success


def test_an_oauth_sender_sends_no_token_in_plain_text_to_another_host(web: Web) -> None:
    """The access token an OAuth sender signs in with is as secret as a password."""
    plain = "smtp://anna@smtp.example.com:25?security=none"
    refused = web.client.post(
        "/api/senders", json={"email": "anna@example.com", "transport": plain, "oauth": GRANT}
    )
    error = _error(refused, 422)
    assert error["field"] == "transport" and "unencrypted" in error["reason"]
    assert _stored(web) == []
    # without the grant, no credential goes out: a relay that takes mail unauthenticated
    sid = web.client.post("/api/senders", json={"email": "anna@example.com", "transport": plain})
    assert sid.status_code == 201, sid.text
    changed = web.client.patch(f"/api/senders/{sid.json()['id']}", json={"oauth": GRANT})
    assert _error(changed, 422)["field"] == "transport"
    assert web.container.sender_store.get_sender(sid.json()["id"]).oauth is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"oauth": REFRESH}, "oauth"),  # the token given as the grant itself
        ({"oauth": [REFRESH]}, "oauth"),
        ({"oauth": {**GRANT, "refreshToken": REFRESH}}, "oauth.refreshToken"),  # misspelt key
        ({"oauth": {**GRANT, "access_token": REFRESH}}, "oauth.access_token"),
        ({"imap": f"anna:{SECRET}@imap.example.com/" + "x" * 2000}, "imap"),  # no scheme
        ({"transport": f"smtp://anna:{SECRET}/" + "x" * 2000}, "transport"),  # no "@"
    ],
)
def test_a_422_from_the_body_s_shape_quotes_no_secret(
    web: Web, body: dict[str, Any], field: str
) -> None:
    response = web.client.post("/api/senders", json={"email": "anna@example.com", **body})
    assert _error(response, 422)["field"] == field
    _clean(response.text)
    assert _stored(web) == []


def test_a_mailbox_timeout_over_two_minutes_is_refused_naming_imap(web: Web) -> None:
    slow = f"imaps://anna:{SECRET}@imap.example.com/INBOX?timeout=3600"
    response = web.client.post("/api/senders", json={"email": "anna@example.com", "imap": slow})
    error = _error(response, 422)
    assert error["field"] == "imap" and "at most 120 seconds" in error["reason"]
    _clean(response.text)
    assert _stored(web) == []
