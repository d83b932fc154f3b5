"""The Senders page and the senders of the new-campaign form, in real Chromium against a real
``sendqueue serve``: usage against the cap as a chart and a table, the add form with its errors
next to the fields, removal after a confirmation, and a campaign created with senders."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

import pytest
from playwright.sync_api import expect

from sendqueue.adapters.sql import open_store
from sendqueue.domain.senders import Booking
from sendqueue.domain.wording import plural
from sendqueue.ports import SenderStore
from tests.e2e.conftest import Sendqueue, api, provision

if TYPE_CHECKING:
    from playwright.sync_api import FilePayload, Page

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e")]

SECRET = "hunter2-e2e-secret"


def _unique(name: str) -> str:
    return f"{name}-{time.monotonic_ns()}@example.com"


def _add_sender(page: Page, app: Sendqueue, **body: Any) -> dict[str, Any]:
    added: dict[str, Any] = api(page, "POST", f"{app.url}/api/senders", data=body)
    return added


def _book(app: Sendqueue, sender_id: str, count: int, *, cap: int, sent: int = 0) -> str:
    """``count`` bookings of the sender today (UTC, its zone), ``sent`` of them sent, made in
    the store's own file as provisioning and the worker would; today's ISO date."""
    noon = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
    store = open_store(app.database_url)
    try:
        senders = cast(SenderStore, store)
        tasks = [f"cbook{sender_id}-{i}" for i in range(count)]
        senders.book(
            [
                Booking(
                    sender_id=sender_id,
                    at=noon + timedelta(minutes=i),
                    day=noon.date(),
                    task_id=task,
                    campaign_id=f"cbook{sender_id}",
                    recipient=f"r{i}@example.com",
                    cap=cap,
                )
                for i, task in enumerate(tasks)
            ]
        )
        for task in tasks[:sent]:
            assert senders.mark_sent(task)
    finally:
        store.close()
    return noon.date().isoformat()


def test_the_page_shows_usage_against_the_cap_as_a_chart_and_a_table(
    page: Page, shared_sendqueue: Sendqueue
) -> None:
    app = shared_sendqueue
    page.goto(f"{app.url}/")
    email = _unique("busy")
    sender = _add_sender(
        page, app, email=email, daily_cap=10, warmup_start=4, warmup_step=2,
        transport=f"smtp://busy:{SECRET}@mail.example.com:587",
    )  # fmt: skip
    sid = sender["id"]
    today = _book(app, sid, 3, cap=4, sent=1)

    page.click('nav a[href="/senders"]')
    expect(page).to_have_url(f"{app.url}/senders")
    expect(page.locator('nav a[href="/senders"]')).to_have_attribute("aria-current", "page")
    section = page.locator(f"#sender-{sid}")
    expect(section.locator("h2")).to_contain_text(email)
    expect(section.locator('[data-field="transport"]')).to_have_text(
        "smtp://busy:***@mail.example.com:587"
    )
    assert SECRET not in page.content()

    # the chart: one bar a day for 14 days, today's sent and planned parts and the cap's mark
    chart = page.locator(f"#usage-chart-{sid}")
    expect(chart).to_be_visible()
    expect(chart).to_have_attribute("role", "img")
    expect(chart).to_have_attribute("aria-label", re.compile(r"2 planned and 1 sent over 14 day"))
    days = chart.locator("g.day")
    expect(days).to_have_count(14)
    first = days.first
    expect(first.locator("title")).to_have_text(f"{today}: 2 planned, 1 sent, cap 4 (1 free)")
    sent_h = float(first.locator("rect.bar-done").get_attribute("height") or 0)
    planned_h = float(first.locator("rect.bar-planned").get_attribute("height") or 0)
    assert planned_h == pytest.approx(2 * sent_h, abs=1) and sent_h > 0
    # the scale reaches the full cap (10); the ramp's first day marks 4 of it
    cap_y = float(first.locator("line.cap-mark").get_attribute("y1") or 0)
    last_cap_y = float(days.last.locator("line.cap-mark").get_attribute("y1") or 0)
    assert last_cap_y < cap_y

    # the same numbers as a table, the text alternative
    table = page.locator(f"#usage-{sid}")
    expect(table.locator("tbody tr")).to_have_count(14)
    row = table.locator(f'tr[data-date="{today}"]')
    for field, value in {"planned": "2", "sent": "1", "cap": "4", "free": "1"}.items():
        expect(row.locator(f'[data-field="{field}"]')).to_have_text(value)
    tomorrow = table.locator("tbody tr").nth(1)
    expect(tomorrow.locator('[data-field="cap"]')).to_have_text("6")
    expect(tomorrow.locator('[data-field="free"]')).to_have_text("6")

    # a phone: the chart and the table scroll inside their boxes, not the page
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    overflow = page.evaluate(
        "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0, f"the page is wider than the phone by {overflow}px"


def test_adding_a_sender_through_the_form_then_removing_it(
    page: Page, shared_sendqueue: Sendqueue
) -> None:
    app = shared_sendqueue
    page.goto(f"{app.url}/senders")
    email = _unique("form")
    page.fill("#s-email", email)
    page.fill("#s-name", "Form Sender")
    page.fill("#s-daily-cap", "0")
    page.fill("#s-transport", f"smtp://form:{SECRET}@mail.example.com:587")
    page.click("#sender-add-button")
    # refused next to its field, and nothing is added
    expect(page.locator("#err-daily_cap")).to_be_visible()
    expect(page.locator("#err-daily_cap")).to_contain_text("from 1 to 10000")
    expect(page.locator("#s-daily-cap")).to_have_attribute("aria-invalid", "true")
    assert page.evaluate("() => document.activeElement.id") == "s-daily-cap"
    listed = api(page, "GET", f"{app.url}/api/senders")["senders"]
    assert email not in [s["email"] for s in listed]

    page.fill("#s-daily-cap", "25")
    page.fill("#s-warmup-start", "5")
    page.click("#sender-add-button")  # a warm-up needs both halves
    expect(page.locator("#err-warmup_step")).to_be_visible()
    expect(page.locator("#err-daily_cap")).to_be_hidden()
    expect(page.locator("#s-warmup-step")).to_have_attribute("aria-invalid", "true")

    page.fill("#s-warmup-step", "5")
    page.fill("#s-timezone", "Asia/Tokyo")
    page.click("#sender-add-button")
    page.wait_for_url(re.compile(r"/senders\?added=s[0-9a-f]+"))
    added = next(s for s in api(page, "GET", f"{app.url}/api/senders")["senders"]
                 if s["email"] == email)  # fmt: skip
    sid = added["id"]
    assert (added["daily_cap"], added["warmup_start"], added["timezone"]) == (25, 5, "Asia/Tokyo")
    expect(page.locator("#senders-status")).to_have_text(f"Sender {email} ({sid}) added.")
    section = page.locator(f"#sender-{sid}")
    expect(section.locator('[data-field="transport"]')).to_have_text(
        "smtp://form:***@mail.example.com:587"
    )
    first_day = section.locator(f"#usage-{sid} tbody tr").first
    expect(first_day.locator('[data-field="cap"]')).to_have_text("5")
    assert SECRET not in page.content()

    # an address that is taken: the error names the field
    page.fill("#s-email", email.upper())
    page.click("#sender-add-button")
    expect(page.locator("#err-email")).to_contain_text("belongs to sender")

    # removing asks first; keeping it changes nothing
    dialog = page.locator("#confirm-dialog")
    section.locator("[data-remove-sender]").click()
    expect(dialog).to_be_visible()
    expect(page.locator("#confirm-message")).to_contain_text(email)
    page.click('#confirm-dialog button[value="cancel"]')
    expect(dialog).to_be_hidden()
    expect(section).to_be_visible()
    section.locator("[data-remove-sender]").click()
    page.click("#confirm-ok")
    expect(section).to_have_count(0)
    expect(page.locator("#senders-status")).to_have_text(f"Sender {email} removed.")
    listed = api(page, "GET", f"{app.url}/api/senders")["senders"]
    assert sid not in [s["id"] for s in listed]
    # the count in words, as the page's script updates it
    expect(page.locator("#senders-count")).to_have_text(plural(len(listed), "sender"))


def test_a_sender_with_planned_sends_is_not_removed(
    page: Page, shared_sendqueue: Sendqueue
) -> None:
    app = shared_sendqueue
    page.goto(f"{app.url}/")
    sid = _add_sender(page, app, email=_unique("held"))["id"]
    _book(app, sid, 2, cap=50)
    page.goto(f"{app.url}/senders")
    section = page.locator(f"#sender-{sid}")
    section.locator("[data-remove-sender]").click()
    page.click("#confirm-ok")
    expect(page.locator("#senders-error")).to_contain_text("Not removed")
    expect(page.locator("#senders-error")).to_contain_text("2 planned sends")
    expect(section).to_be_visible()
    assert sid in [s["id"] for s in api(page, "GET", f"{app.url}/api/senders")["senders"]]


def _csv(rows: list[str]) -> FilePayload:
    return {"name": "r.csv", "mimeType": "text/csv", "buffer": ("\n".join(rows) + "\n").encode()}


def test_the_new_campaign_form_lists_the_senders_and_creates_with_them(
    page: Page, shared_sendqueue: Sendqueue
) -> None:
    app = shared_sendqueue
    page.goto(f"{app.url}/")
    first = _add_sender(page, app, email=_unique("first"), name="First", daily_cap=7)
    second = _add_sender(page, app, email=_unique("second"))
    page.click('nav a[href="/campaigns/new"]')
    boxes = page.locator('#f-senders input[name="senders"]')
    assert boxes.count() >= 2
    label = page.locator(f"label:has(#f-sender-{first['id']})")
    expect(label).to_contain_text(first["email"])
    expect(label).to_contain_text("7 a day")

    page.set_input_files(
        "#f-file",
        files=[_csv(["email,name,timezone", "a@example.com,A,Asia/Tokyo", "b@example.com,B,"])],
    )
    page.fill("#f-name", "With senders")
    page.fill("#f-subject", "Hello")
    page.fill("#f-body", "Body")
    page.fill("#f-timezone", "UTC")
    page.fill("#f-start", "2099-01-05T09:00")
    page.check(f"#f-sender-{first['id']}")
    page.check(f"#f-sender-{second['id']}")
    page.check("#f-local-time")
    page.click("#create-button")
    page.wait_for_url(re.compile(r"/campaigns/c[0-9a-f]+$"))
    cid = page.url.rsplit("/", 1)[1]
    campaign = api(page, "GET", f"{app.url}/api/campaigns/{cid}")
    assert campaign["senders"] == [first["id"], second["id"]]
    assert campaign["local_time"] is True

    # provisioned, each email's row names the sender it goes out from
    provision(page, app.url, cid)
    page.goto(f"{app.url}/campaigns/{cid}")
    senders = page.locator('#tasks [data-field="sender"]')
    expect(senders).to_have_count(2)
    # "Name <address>", or the address of a sender without a name
    assert set(senders.all_inner_texts()) <= {f"First <{first['email']}>", second["email"]}
    tasks = api(page, "GET", f"{app.url}/api/campaigns/{cid}/tasks")["tasks"]
    assert sorted(t["sender"] for t in tasks) == sorted([first["email"], second["email"]])
    expect(page.locator("th", has_text="Sender")).to_have_count(1)


def test_the_form_adds_a_mailbox_signatures_and_an_oauth_grant_shown_masked(
    page: Page, shared_sendqueue: Sendqueue
) -> None:
    app = shared_sendqueue
    page.goto(f"{app.url}/senders")
    email = _unique("grant")
    page.fill("#s-email", email)
    page.fill("#s-imap", f"imap://grant:{SECRET}@imap.example.com/INBOX?security=none")
    page.fill("#s-signature-text", "Grant\nSales")
    page.fill("#s-signature-html", "<p>Grant</p>")
    page.fill("#s-oauth-token_url", "https://oauth2.example.com/token")
    page.fill("#s-oauth-client_id", "client-e2e")
    page.fill("#s-oauth-refresh_token", f"refresh-{SECRET}")
    page.click("#sender-add-button")
    # a password in plain text to another host: refused next to the mailbox's field
    expect(page.locator("#err-imap")).to_contain_text("unencrypted to imap.example.com:143")
    expect(page.locator("#s-imap")).to_have_attribute("aria-invalid", "true")
    assert SECRET not in page.locator("#sender-add").inner_text()
    listed = api(page, "GET", f"{app.url}/api/senders")["senders"]
    assert email not in [s["email"] for s in listed]

    page.fill("#s-imap", f"imaps://grant:{SECRET}@imap.example.com/INBOX")
    page.click("#sender-add-button")
    page.wait_for_url(re.compile(r"/senders\?added=s[0-9a-f]+"))
    added = next(s for s in api(page, "GET", f"{app.url}/api/senders")["senders"]
                 if s["email"] == email)  # fmt: skip
    assert added["oauth"]["refresh_token"] == "***" and added["signature_text"] == "Grant\nSales"
    section = page.locator(f"#sender-{added['id']}")
    expect(section.locator('[data-field="imap"]')).to_have_text(
        "imaps://grant:***@imap.example.com/INBOX"
    )
    expect(section.locator('[data-field="signature"]')).to_have_text("text and HTML")
    expect(section.locator('[data-field="oauth"]')).to_contain_text("client-e2e")
    assert SECRET not in page.content()
