"""The Webhooks page in real Chromium against a real ``sendqueue serve``: an endpoint added
through the form with its signing secret shown once (masked after a reload), a bad URL refused
next to its field with nothing added, filters edited, a rotation that shows the new secret
once, removal after a confirmation; and the delivery log of deliveries a real worker made to a
real HTTP receiver on this machine, with redelivery of one event and of every failed one."""

from __future__ import annotations

import http.server
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import Sendqueue, api, provision

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e")]

SECRET = re.compile(r"whsec_[A-Za-z0-9+/=]{20,}")


class Receiver:
    """An HTTP server on 127.0.0.1 that answers every POST with ``status`` and counts them."""

    def __init__(self) -> None:
        self.status = 204
        self.received: list[str] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                receiver.received.append(self.headers.get("webhook-id", ""))
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


def _hooks(page: Page, app: Sendqueue) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = api(page, "GET", f"{app.url}/api/webhooks")["webhooks"]
    return found


def test_adding_shows_the_secret_once_and_a_bad_url_is_refused_next_to_its_field(
    page: Page, shared_sendqueue: Sendqueue
) -> None:
    app = shared_sendqueue
    page.goto(f"{app.url}/")
    page.click('nav a[href="/webhooks"]')
    expect(page).to_have_url(f"{app.url}/webhooks")
    expect(page.locator('nav a[href="/webhooks"]')).to_have_attribute("aria-current", "page")
    before = len(_hooks(page, app))

    # a bad URL: the error next to the field, focus on it, nothing added
    page.fill("#w-url", "ftp://hooks.example.com/x")
    page.click("#webhook-add-button")
    expect(page.locator("#err-add-url")).to_contain_text("must be http or https")
    expect(page.locator("#w-url")).to_have_attribute("aria-invalid", "true")
    assert page.evaluate("() => document.activeElement.id") == "w-url"
    assert len(_hooks(page, app)) == before
    expect(page.locator("#secret-panel")).to_be_hidden()

    url = f"https://hooks.example.com/e2e-{time.monotonic_ns()}"
    page.fill("#w-url", url)
    page.check('#webhook-add input[value="email.sent"]')
    page.check('#webhook-add input[value="email.bounced"]')
    page.click("#webhook-add-button")
    panel = page.locator("#secret-panel")
    expect(panel).to_be_visible()
    expect(panel).to_contain_text("you won't see it again")
    secret = page.locator("#secret-value").inner_text()
    assert SECRET.fullmatch(secret), secret
    hook = next(h for h in _hooks(page, app) if h["url"] == url)
    assert hook["event_types"] == ["email.sent", "email.bounced"]
    assert hook["secret"] == "whsec_***" + secret[-4:]
    expect(page.locator("#err-add-url")).to_be_hidden()
    expect(page.locator("#w-url")).to_have_value("")
    card = page.locator(f"#webhook-{hook['id']}")
    expect(card.locator('[data-field="secret"]')).to_have_text(hook["secret"])
    expect(card.locator('[data-field="events"]')).to_have_text("email.sent, email.bounced")
    expect(card.locator('[data-field="campaigns"]')).to_have_text("every campaign")
    expect(card.locator('[data-field="state-text"]')).to_have_text("enabled")
    expect(card.locator('[data-field="last"]')).to_have_text("none yet")
    expect(page.locator("#webhooks-status")).to_contain_text(f"({hook['id']}) added")
    # the secret is in the panel only
    assert page.locator("#webhooks").inner_text().count(secret) == 0

    # a reload: the secret is gone for good, masked in the card
    page.reload()
    expect(page.locator("#secret-panel")).to_be_hidden()
    assert secret not in page.content()
    expect(card.locator('[data-field="secret"]')).to_have_text(hook["secret"])

    # edit the filters: every type again
    card.locator("summary").click()
    card.locator('input[value="email.sent"]').uncheck()
    card.locator('input[value="email.bounced"]').uncheck()
    card.locator('button[type="submit"]').click()
    expect(card.locator('[data-field="events"]')).to_have_text("every type")
    expect(page.locator("#webhooks-status")).to_have_text(f"Filters of {url} saved.")
    assert next(h for h in _hooks(page, app) if h["id"] == hook["id"])["event_types"] == []


def test_rotating_shows_the_new_secret_once_and_removing_asks_first(
    page: Page, shared_sendqueue: Sendqueue
) -> None:
    app = shared_sendqueue
    page.goto(f"{app.url}/webhooks")
    url = f"https://hooks.example.com/rotate-{time.monotonic_ns()}"
    made = api(page, "POST", f"{app.url}/api/webhooks", data={"url": url})
    page.reload()
    card = page.locator(f"#webhook-{made['id']}")
    expect(card.locator('[data-field="secret"]')).to_have_text(made["secret"])
    assert made["signing_secret"] not in page.content()

    # rotating asks first; keeping it changes nothing
    card.locator('[data-action="rotate"]').click()
    expect(page.locator("#confirm-dialog")).to_be_visible()
    expect(page.locator("#confirm-message")).to_contain_text(url)
    page.click('#confirm-dialog button[value="cancel"]')
    expect(page.locator("#secret-panel")).to_be_hidden()
    assert next(h for h in _hooks(page, app) if h["id"] == made["id"])["secret"] == made["secret"]

    # by keyboard: Enter on the button, Escape keeps it, then Tab to the confirmation
    rotate = card.locator('[data-action="rotate"]')
    rotate.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#confirm-dialog")).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.locator("#confirm-dialog")).to_be_hidden()
    expect(rotate).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#confirm-dialog")).to_be_visible()
    page.keyboard.press("Tab")
    expect(page.locator("#confirm-ok")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#secret-panel")).to_be_visible()
    expect(page.locator("#secret-panel")).to_be_focused()
    new = page.locator("#secret-value").inner_text()
    assert SECRET.fullmatch(new) and new != made["signing_secret"]
    masked = "whsec_***" + new[-4:]
    expect(card.locator('[data-field="secret"]')).to_contain_text(masked)
    expect(card.locator('[data-field="secret"]')).to_contain_text("the previous one signs too")
    page.click("#secret-done")
    expect(page.locator("#secret-panel")).to_be_hidden()
    expect(page.locator("#w-url")).to_be_focused()

    # a second rotation within the day says that the first secret stops signing
    card.locator('[data-action="rotate"]').click()
    expect(page.locator("#confirm-message")).to_contain_text(
        "The secret the last rotation replaced stops signing now."
    )
    page.click('#confirm-dialog button[value="cancel"]')
    assert new not in page.content()
    page.reload()
    assert new not in page.content()

    # removing asks first
    card.locator('[data-action="remove"]').click()
    page.click('#confirm-dialog button[value="cancel"]')
    expect(card).to_be_visible()
    card.locator('[data-action="remove"]').click()
    page.click("#confirm-ok")
    expect(card).to_have_count(0)
    expect(page.locator("#webhooks-status")).to_have_text(f"Webhook {url} removed.")
    assert made["id"] not in [h["id"] for h in _hooks(page, app)]


def _wait_for(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.1)


def _cancelled_emails(page: Page, app: Sendqueue, count: int) -> None:
    """A provisioned campaign with ``count`` of its emails cancelled: ``email.cancelled``
    events in the change log."""
    created = api(
        page,
        "POST",
        f"{app.url}/api/campaigns",
        data={
            "name": "Hooked",
            "recipients": [{"email": f"h{i}@example.com"} for i in range(count + 1)],
            "templates": {"subject": "Hi", "body": "Hello"},
            "policy": {"timezone": "UTC", "start": "2099-01-05T09:00:00Z"},
        },
    )
    cid = str(created["id"])
    provision(page, app.url, cid)
    for position in range(1, count + 1):
        api(page, "POST", f"{app.url}/api/campaigns/{cid}/tasks/{cid}-{position}/cancel")


def test_the_delivery_log_shows_a_real_receivers_answers_and_redelivers(
    page: Page, sendqueue: Callable[..., Sendqueue], receiver: Receiver
) -> None:
    # the receiver is on loopback, which webhooks may reach only when allowed; a failed
    # delivery is retried an hour later, so only the page's buttons send it again
    app = sendqueue(
        env={
            "SENDQUEUE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
            "SENDQUEUE_WEBHOOK_RETRY_BASE": "3600",
            "SENDQUEUE_UI_POLL_INTERVAL": "0.5",
        }
    )
    app.start_worker()
    page.goto(f"{app.url}/webhooks")
    hook = api(page, "POST", f"{app.url}/api/webhooks", data={"url": receiver.url})
    hid = hook["id"]
    deliveries_url = f"{app.url}/api/webhooks/{hid}/deliveries"

    receiver.status = 500
    _cancelled_emails(page, app, 2)
    _wait_for(lambda: bool(api(page, "GET", deliveries_url)["deliveries"]), "a first attempt")
    failed = api(page, "GET", deliveries_url)["deliveries"][0]
    assert (failed["ok"], failed["status"], failed["event_type"]) == (False, 500, "email.cancelled")

    page.reload()
    card = page.locator(f"#webhook-{hid}")
    expect(card.locator('[data-field="last"]')).to_contain_text("500")
    expect(card.locator('[data-field="failing"]')).to_contain_text("1 failed attempt since")
    card.locator("h2 a").click()
    expect(page).to_have_url(f"{app.url}/webhooks/{hid}")
    rows = page.locator("#deliveries tbody tr")
    expect(rows).to_have_count(1)
    first = rows.first
    expect(first).to_have_attribute("data-event-id", failed["event_id"])
    expect(first.locator('[data-field="result"]')).to_contain_text("failed 500")
    expect(first.locator('[data-field="attempt"]')).to_have_text("1")
    expect(first.locator('[data-field="latency"]')).to_have_text(re.compile(r"^\d+ ms$"))
    expect(first.locator("time")).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d UTC$"))

    # one event again, now that the receiver answers 204
    receiver.status = 204
    first.locator('[data-action="redeliver"]').click()
    expect(page.locator("#webhooks-status")).to_have_text(
        "Redelivered 1 event: 1 delivered, 0 failed."
    )
    expect(rows).to_have_count(2)
    expect(rows.first.locator('[data-field="result"]')).to_contain_text("ok 204")
    expect(rows.first.locator('[data-field="attempt"]')).to_have_text("1 (redelivery)")

    # every failed one (the same event: its failed attempt is still on the log)
    page.click('[data-action="redeliver-failed"]')
    expect(page.locator("#webhooks-status")).to_have_text(
        "Redelivered 1 event: 1 delivered, 0 failed."
    )
    expect(rows).to_have_count(3)
    assert receiver.received.count(failed["event_id"]) == 3

    # the endpoint's own order was left alone: its head still waits for its retry. Disabling
    # and enabling it clears that; its events then follow in order.
    card = page.locator(f"#webhook-{hid}")
    card.locator('[data-action="toggle"]').click()
    expect(card.locator('[data-field="state-text"]')).to_have_text("disabled: disabled by a user")
    expect(card.locator('[data-action="toggle"]')).to_have_text("Enable")
    card.locator('[data-action="toggle"]').click()
    expect(card.locator('[data-field="state-text"]')).to_have_text("enabled")
    # the page draws the worker's deliveries by itself once the focus has left its lists
    page.locator("h1").click()
    expect(rows).to_have_count(5)
    page.reload()
    expect(rows).to_have_count(5)
    expect(card.locator('[data-field="failing"]')).to_have_text("no")
    expect(card.locator('[data-field="last"]')).to_contain_text("204")
    assert [r["ok"] for r in api(page, "GET", deliveries_url)["deliveries"]][:2] == [True, True]

    # a phone: the log is cards, nothing scrolls sideways
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    overflow = page.evaluate(
        "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0, f"the page is wider than the phone by {overflow}px"

    # removing it from its own page goes back to the list
    page.locator('[data-action="remove"]').click()
    page.click("#confirm-ok")
    expect(page).to_have_url(f"{app.url}/webhooks")
    assert hid not in [h["id"] for h in _hooks(page, app)]
