"""The Webhooks pages over HTTP: secrets masked, the last delivery and failures of each
endpoint, and the delivery log's pages (7 days, newest first, 25 a page)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, cast

from sendqueue.domain.webhooks import DeliveryRecord
from sendqueue.ports.webhooks import WebhookStore
from tests.web.conftest import Web

HTML = {"Accept": "text/html,application/xhtml+xml"}


def _hook(web: Web, **body: Any) -> dict[str, Any]:
    added = web.client.post("/api/webhooks", json={"url": "https://hooks.example.com/x", **body})
    assert added.status_code == 201, added.text
    made: dict[str, Any] = added.json()
    return made


def _log(web: Web) -> WebhookStore:
    """The store's delivery log (every task store is a WebhookStore)."""
    return cast(WebhookStore, web.container.store)


def _record(web: Web, hook: str, count: int, *, start: int = 0, days_ago: float = 0) -> None:
    at = web.clock.now() - timedelta(days=days_ago)
    _log(web).record_deliveries(
        [
            DeliveryRecord(hook, f"evt_{start + i}", "email.sent", at, 1, 40 + i, 200)
            for i in range(count)
        ]
    )


def test_the_list_shows_each_endpoint_masked_with_its_last_delivery(web: Web) -> None:
    made = _hook(web, events=["email.sent"])
    quiet = _hook(web)
    _log(web).record_deliveries(
        [
            DeliveryRecord(
                made["id"], "evt_7", "email.sent", web.clock.now(), 1, 812, 503, "HTTP 503"
            )
        ]
    )
    page = web.client.get("/webhooks").text
    assert made["signing_secret"] not in page and quiet["signing_secret"] not in page
    assert made["secret"] in page and made["secret"].startswith("whsec_***")
    assert '<a href="/webhooks" aria-current="page">Webhooks</a>' in page
    card = page.split(f'id="webhook-{made["id"]}"', 1)[1].split("</section>", 1)[0]
    assert re.search(r'data-field="last"><span class="error-text">503: HTTP 503</span>', card)
    assert ">2026-12-01 08:00 UTC</time>" in card
    assert 'data-field="events"><span class="mono">email.sent</span>' in card
    other = page.split(f'id="webhook-{quiet["id"]}"', 1)[1].split("</section>", 1)[0]
    assert 'data-field="last">none yet<' in other and 'data-field="events">every type<' in other
    assert "2 endpoints" in page


def test_the_delivery_log_pages_through_the_last_seven_days_newest_first(web: Web) -> None:
    hook = _hook(web)["id"]
    _record(web, hook, 3, start=100, days_ago=8)  # older than the log keeps
    _record(web, hook, 50, start=0)  # all at one instant: the cursor tells them apart
    first = web.client.get(f"/webhooks/{hook}").text
    assert re.findall(r'<tr data-event-id="(evt_\d+)"', first) == [
        f"evt_{i}" for i in range(49, 24, -1)
    ]
    older = re.search(r'<a class="button" id="older-attempts" href="\?before=([\w-]+)">', first)
    assert older is not None and "Newest attempts" not in first
    assert 'data-action="redeliver-failed" hidden' in first  # nothing failed
    second = web.client.get(f"/webhooks/{hook}?before={older[1]}").text
    assert re.findall(r'<tr data-event-id="(evt_\d+)"', second) == [
        f"evt_{i}" for i in range(24, -1, -1)
    ]
    # the attempts past the 7 days, not yet pruned, are not a page of their own
    assert f'href="/webhooks/{hook}">Newest attempts<' in second and "older-attempts" not in second
    assert "25 attempts shown, older than the previous page" in second


def test_a_cursor_not_of_the_log_is_the_bad_request_page(web: Web) -> None:
    hook = _hook(web)["id"]
    response = web.client.get(f"/webhooks/{hook}?before=nope", headers=HTML)
    assert response.status_code == 400 and "text/html" in response.headers["content-type"]
    assert "before: is not a cursor of this webhook" in response.text


def test_an_unknown_endpoint_is_the_not_found_page(web: Web) -> None:
    response = web.client.get("/webhooks/wh_0000000000000000", headers=HTML)
    assert response.status_code == 404
    assert "text/html" in response.headers["content-type"]
