"""The event stream breaks: the page says "polling", keeps its rows current by refetching, and
goes back to "live" once the stream can be opened again."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import Sendqueue, api, provision, sending_window, utcnow
from tests.support.smtp import SmtpSink

if TYPE_CHECKING:
    from playwright.sync_api import Page, Route

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e")]

COUNT = 8
FINISHED = '#tasks tr[data-state="Finished"]'
# Every change of a row's state, with the connection mode the page was in when it happened.
RECORD_MODE_OF_ROW_CHANGES = """() => {
  window.__changes = [];
  new MutationObserver((records) => {
    const mode = document.getElementById("connection").dataset.connection;
    for (const r of records) {
      window.__changes.push({id: r.target.dataset.taskId, to: r.target.dataset.state, mode});
    }
  }).observe(document.getElementById("tasks"), {
    subtree: true, attributes: true, attributeFilter: ["data-state"],
  });
}"""


def create_and_provision(
    page: Page, base: str, *, count: int, seconds_apart: float, start_in: float = 0.0
) -> str:
    """A campaign through the JSON API whose sends start in ``start_in`` seconds (or at once),
    ``seconds_apart`` apart."""
    now = utcnow()
    zone, windows = sending_window(now, minutes=4)
    page.goto(f"{base}/")  # for the CSRF cookie
    campaign = api(
        page,
        "POST",
        f"{base}/api/campaigns",
        data={
            "name": "Fallback",
            "from": "news@example.com",
            "recipients": [{"email": f"fb{i}@example.com", "name": f"R {i}"} for i in range(count)],
            "templates": {"subject": "Hi {{ name }}", "body": "Hello"},
            "policy": {
                "timezone": zone,
                "per_day": int(4 * 60 / seconds_apart),
                "weekdays": "mon-sun",
                "windows": windows,
                "start": (now + timedelta(seconds=start_in)).isoformat(),
            },
        },
    )
    cid = str(campaign["id"])
    provision(page, base, cid)
    return cid


def test_blocked_stream_falls_back_to_polling_and_recovers(
    page: Page, sendqueue: Callable[..., Sendqueue], smtp_sink: SmtpSink
) -> None:
    app = sendqueue(smtp_sink.url())
    app.start_worker()
    cid = create_and_provision(page, app.url, count=COUNT, seconds_apart=1.0, start_in=3)
    # the campaigns list, open in another tab, follows by itself too
    listing = page.context.new_page()
    listing.goto(f"{app.url}/")
    listing.evaluate("() => { window.__loadedAt = 'list'; }")
    attempts: list[str] = []

    def refuse(route: Route) -> None:
        attempts.append(route.request.url)
        route.abort()

    page.route("**/events*", refuse)
    page.goto(f"{app.url}/campaigns/{cid}")
    page.evaluate("() => { window.__loadedAt = 'blocked'; }")
    indicator = page.locator("#connection")
    expect(indicator).to_have_attribute("data-connection", "polling")
    expect(page.locator("#connection-text")).to_contain_text("Polling")
    page.evaluate(RECORD_MODE_OF_ROW_CHANGES)

    # emails are sent while the stream is down, and their rows change all the same
    page.wait_for_function(
        "() => window.__changes.some((c) => c.to === 'Finished' && c.mode !== 'live')",
        timeout=25_000,
    )
    assert len(attempts) >= 2, "the page stopped trying to reopen the stream"
    changes = page.evaluate("() => window.__changes")
    assert "live" not in {c["mode"] for c in changes}, changes

    page.unroute("**/events*")
    expect(indicator).to_have_attribute("data-connection", "live", timeout=15_000)
    expect(page.locator(FINISHED)).to_have_count(COUNT, timeout=30_000)
    expect(page.locator('.counts [data-count="Finished"]')).to_have_text(str(COUNT))
    assert indicator.get_attribute("data-connection") == "live"
    assert page.evaluate("() => window.__loadedAt") == "blocked"
    row = listing.locator(f'tr[data-campaign-id="{cid}"]')
    expect(row.locator('[data-count="Finished"]')).to_have_text(str(COUNT), timeout=10_000)
    expect(row.locator('[data-field="state"] .badge')).to_have_text("completed")
    expect(row.locator("[data-progress-text]")).to_have_text(f"{COUNT} / {COUNT} (100%)")
    assert listing.evaluate("() => window.__loadedAt") == "list"


def test_polling_stops_when_nothing_is_in_flight(page: Page, shared_sendqueue: Sendqueue) -> None:
    """A campaign with nothing in flight and a dead stream has nothing to poll for."""
    app = shared_sendqueue
    cid = create_and_provision(page, app.url, count=3, seconds_apart=60)
    api(page, "POST", f"{app.url}/api/campaigns/{cid}/cancel")
    tasks_requests: list[Any] = []
    page.on(
        "request",
        lambda request: tasks_requests.append(request.url) if "/tasks" in request.url else None,
    )
    page.clock.install()
    page.route("**/events*", lambda route: route.abort())
    page.goto(f"{app.url}/campaigns/{cid}")
    expect(page.locator('#tasks tr[data-state="Cancelled"]')).to_have_count(3)
    expect(page.locator("#connection")).to_have_attribute("data-connection", "idle")
    page.clock.run_for(12_000)  # two polling periods, on the page's faked clock
    page.wait_for_timeout(300)  # a poll would have sent its request by now
    assert tasks_requests == [], "the page polled a campaign with nothing in flight"
    expect(page.locator("#connection")).to_have_attribute("data-connection", "idle")


def test_a_silent_stream_counts_as_broken(page: Page, shared_sendqueue: Sendqueue) -> None:
    """No event and no ping for longer than the heartbeat allows (20 s): the page polls, and
    reopens the stream. The page's clock is faked, so the 20 s pass at once."""
    app = shared_sendqueue
    page.goto(f"{app.url}/")
    created = api(
        page,
        "POST",
        f"{app.url}/api/campaigns",
        data={
            "name": "Quiet",
            "recipients": [{"email": "q@example.com"}],
            "templates": {"subject": "S", "body": "B"},
            "policy": {"timezone": "UTC", "start": "2099-01-05T09:00:00Z"},
        },
    )
    provision(page, app.url, created["id"])
    page.clock.install()
    page.goto(f"{app.url}/campaigns/{created['id']}")
    expect(page.locator("#tasks tr")).to_have_count(1)
    indicator = page.locator("#connection")
    expect(indicator).to_have_attribute("data-connection", "live")
    opened: list[str] = []
    page.on("request", lambda r: opened.append(r.url) if "/events" in r.url else None)

    page.clock.fast_forward(21_000)
    expect(indicator).to_have_attribute("data-connection", "polling")
    page.clock.fast_forward(2_000)  # past the first reconnect delay
    expect(indicator).to_have_attribute("data-connection", "live")
    assert len(opened) == 1
    assert "after=" in opened[0], "a reopened stream resumes after the last event it saw"
