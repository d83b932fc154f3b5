"""The OpenAPI document describes every success body of the API, and the form CSRF check
guards exactly the routes that take a form."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from sendqueue.web.middleware.csrf import form_routes
from sendqueue.web.middleware.headers import CSP, DOCS_CSP
from sendqueue.web.routers import ROUTERS
from tests.web.conftest import Web

_METHODS = {"get", "post", "put", "patch", "delete"}


def _resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].removeprefix("#/components/schemas/")
        schema = document["components"]["schemas"][name]
    return schema


def test_every_api_success_body_has_a_schema_with_properties(web: Web) -> None:
    document = web.client.get("/openapi.json").json()
    checked: list[str] = []
    for path, operations in document["paths"].items():
        if not path.startswith("/api/"):
            continue
        for method, operation in operations.items():
            if method not in _METHODS:
                continue
            where = f"{method.upper()} {path}"
            successes = {s: r for s, r in operation["responses"].items() if s.startswith("2")}
            assert successes, f"{where}: no success response documented"
            for status, response in successes.items():
                content = response.get("content", {})
                if "text/event-stream" in content:
                    continue
                if "text/csv" in content:  # the suppression list's export: CSV by design
                    assert content["text/csv"]["schema"] == {"type": "string"}, where
                    continue
                assert "application/json" in content, f"{where} {status}: not JSON: {content}"
                schema = _resolve(document, content["application/json"].get("schema", {}))
                assert schema.get("properties"), f"{where} {status}: an empty schema {schema}"
                checked.append(where)
    # every JSON route of the API, not a vacuous pass
    assert len(checked) >= 15, checked


def test_the_views_are_in_the_schema_with_their_json_names(web: Web) -> None:
    schemas = web.client.get("/openapi.json").json()["components"]["schemas"]
    assert set(schemas["TaskView"]["properties"]) == {
        "id", "position", "step", "email", "name", "subject", "sender", "sender_name", "timezone",
        "state", "send_at",
        "sent_at", "attempts", "message_id", "error", "planned_at", "moves", "moved_reason",
        "reason", "outcome", "outcome_detail", "outcome_at", "paused", "late",
    }  # fmt: skip
    assert {
        "from", "counts", "next_send_at", "moved", "late", "suppressed", "outcomes",
        "stop_on_reply", "unsubscribe_footer",
    } <= set(schemas["CampaignDetail"]["properties"])  # fmt: skip
    assert set(schemas["DeadLetterView"]["properties"]) == {
        "id", "schedule", "group", "payload", "error", "attempts", "failed_at",
    }  # fmt: skip
    assert set(schemas["SuppressionView"]["properties"]) == {"email", "reason", "task_id", "at"}
    assert set(schemas["SenderDetail"]["properties"]) == {
        "id", "email", "name", "reply_to", "transport", "daily_cap", "min_gap_seconds",
        "timezone", "warmup_start", "warmup_step", "warmup_from", "usage", "imap",
        "signature_text", "signature_html", "oauth", "mailbox",
    }  # fmt: skip
    assert set(schemas["SenderOAuth"]["properties"]) == {
        "token_url", "client_id", "scope", "refresh_token", "client_secret",
    }  # fmt: skip
    assert set(schemas["SenderMailbox"]["properties"]) == {
        "mailbox", "polled_at", "messages_read", "last_error",
    }  # fmt: skip


def test_only_the_three_forms_take_the_csrf_token_as_a_field() -> None:
    assert form_routes(ROUTERS) == {
        ("POST", "/login"),
        ("POST", "/logout"),
        ("POST", "/api/campaigns"),
    }


_TOKEN = "docs-check-7Qe2-Lm9x-Rt4v"


def test_production_serves_the_schema_and_no_viewer_that_loads_from_another_host(
    make_web: Callable[..., Web],
) -> None:
    web = make_web(
        environment="production",
        mailer="smtp://127.0.0.1:2525",
        api_token=_TOKEN,
        public_url="https://mail.example.com",
        secret_key="openapi-test-secret-0123456789abcdef",
    )
    auth = {"Authorization": f"Bearer {_TOKEN}", "Accept": "text/html"}
    assert web.client.get("/openapi.json", headers=auth).json()["info"]["title"] == "sendqueue"
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        response = web.client.get(path, headers=auth)
        assert response.status_code == 404, path
        assert not re.search(r"(?:https?:)?//", response.text), response.text
        assert response.headers["content-security-policy"] == CSP  # not the viewers' policy


def test_development_keeps_the_viewers_under_their_own_policy(web: Web) -> None:
    docs = web.client.get("/docs")
    assert docs.status_code == 200
    assert docs.headers["content-security-policy"] == DOCS_CSP
    assert web.client.get("/openapi.json").headers["content-security-policy"] == CSP
