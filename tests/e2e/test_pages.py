"""What users typed stays text; the form shows errors where they belong; keyboard, dialogs and
a phone-sized screen work."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from playwright.sync_api import expect

import sendqueue.web
from sendqueue.adapters.embedded.scheduler import EmbeddedScheduler
from sendqueue.domain.wording import plural
from tests.e2e.conftest import Sendqueue, api, provision

if TYPE_CHECKING:
    from playwright.sync_api import FilePayload, Page

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e")]

IMG = "<img src=x onerror=window.__xss=1>"
SCRIPT = "<script>window.__xss=1</script>"
XSS_CHECK = "() => window.__xss"
# Where the focus is while the confirmation is open: one of its buttons, or "outside-page"
# (the browser's own controls), or the id/tag of a page element (which must not happen).
FOCUSED_IN_DIALOG = """() => {
  const el = document.activeElement;
  if (!el || el === document.body) return "outside-page";
  if (document.getElementById("confirm-dialog").contains(el)) return el.value || el.tagName;
  return "page:" + (el.id || el.tagName);
}"""


def _csv(rows: list[str]) -> FilePayload:
    return {"name": "r.csv", "mimeType": "text/csv", "buffer": ("\n".join(rows) + "\n").encode()}


def _fill_basics(page: Page, name: str) -> None:
    page.fill("#f-name", name)
    page.fill("#f-subject", "Hello")
    page.fill("#f-body", "Body")
    page.fill("#f-timezone", "UTC")
    page.fill("#f-start", "2099-01-05T09:00")  # far away: nothing is sent during the test


def _assert_no_injection(page: Page) -> None:
    assert page.evaluate(XSS_CHECK) is None
    assert page.locator("main img, main script").count() == 0


def test_typed_text_stays_text_everywhere(page: Page, shared_sendqueue: Sendqueue) -> None:
    app = shared_sendqueue
    page.goto(f"{app.url}/campaigns/new")
    page.set_input_files(
        "#f-file",
        files=[
            _csv(
                [
                    "email,name,subject",
                    f'a@example.com,"{IMG}","{SCRIPT}"',
                    f'b@example.com,"{SCRIPT}","{IMG}"',
                ]
            )
        ],
    )
    _fill_basics(page, f"{IMG} {SCRIPT}")
    page.fill("#f-from", f'"{IMG}" <news@example.com>')
    page.fill("#f-reply-to", f'"{SCRIPT}" <reply@example.com>')
    page.click("#create-button")
    page.wait_for_url(re.compile(r"/campaigns/c[0-9a-f]+$"))
    cid = page.url.rsplit("/", 1)[1]

    # the campaign page, server-rendered
    expect(page.locator("#campaign-name")).to_have_text(f"{IMG} {SCRIPT}")
    expect(page.locator("#campaign-from")).to_contain_text(IMG)
    expect(page.locator("#campaign-reply-to")).to_contain_text(SCRIPT)
    assert page.title().startswith(f"{IMG} {SCRIPT}")
    _assert_no_injection(page)

    # the task table, drawn by the script from the API after provisioning
    page.click('[data-action="provision"]')
    rows = page.locator("#tasks tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0).locator('[data-field="name"]')).to_have_text(IMG)
    expect(rows.nth(0).locator('[data-field="subject"]')).to_have_text(SCRIPT)
    expect(rows.nth(1).locator('[data-field="name"]')).to_have_text(SCRIPT)
    expect(rows.nth(1).locator('[data-field="subject"]')).to_have_text(IMG)
    _assert_no_injection(page)

    # ... and server-rendered, after a reload; the search box echoes a payload as text
    page.goto(f"{app.url}/campaigns/{cid}?search={SCRIPT}")
    expect(page.locator("#filter-search")).to_have_value(SCRIPT)
    page.goto(f"{app.url}/campaigns/{cid}")
    expect(page.locator("#tasks tr").nth(0).locator('[data-field="name"]')).to_have_text(IMG)
    _assert_no_injection(page)

    # the list
    page.goto(f"{app.url}/")
    expect(page.locator(f'tr[data-campaign-id="{cid}"] [data-field="name"]')).to_have_text(
        f"{IMG} {SCRIPT}"
    )
    _assert_no_injection(page)

    # a CSV error quotes the bad cell back, as text
    page.goto(f"{app.url}/campaigns/new")
    page.set_input_files("#f-file", files=[_csv(["email,name", f'"{IMG}",x'])])
    _fill_basics(page, "bad rows")
    page.click("#create-button")
    expect(page.locator("#row-errors li")).to_have_count(1)
    expect(page.locator("#row-errors li")).to_contain_text(IMG)
    _assert_no_injection(page)


def test_form_errors_next_to_fields_and_rows(page: Page, shared_sendqueue: Sendqueue) -> None:
    app = shared_sendqueue
    page.goto(f"{app.url}/campaigns/new")
    page.set_input_files(
        "#f-file",
        files=[_csv(["email,name", "ok@example.com,A", "not-an-address,B", "also bad,C"])],
    )
    _fill_basics(page, "With errors")
    page.click("#create-button")
    items = page.locator("#row-errors li")
    expect(items).to_have_count(2)
    expect(items.nth(0)).to_contain_text("row 3: email")
    expect(items.nth(1)).to_contain_text("row 4: email")
    expect(page.locator("#err-file")).to_be_visible()
    assert page.url.endswith("/campaigns/new")

    page.set_input_files("#f-file", files=[_csv(["email", "ok@example.com"])])
    page.fill("#f-timezone", "Mars/Olympus_Mons")
    page.click("#preview-button")
    expect(page.locator("#err-timezone")).to_be_visible()
    expect(page.locator("#err-timezone")).to_contain_text("timezone")
    expect(page.locator("#f-timezone")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#row-errors li")).to_have_count(0)

    page.fill("#f-timezone", "UTC")
    page.click("#add-window")
    expect(page.locator("#windows li")).to_have_count(2)
    expect(page.locator('label[for="f-window-2"]')).to_have_text("Window 2")
    page.fill("#f-window-1", "09:00-12:00")
    page.fill("#f-window-2", "11:00-17:00")  # overlaps the first
    page.click("#preview-button")
    expect(page.locator("#err-windows")).to_contain_text("overlap")
    expect(page.locator("#err-timezone")).to_be_hidden()

    page.fill("#f-window-2", "13:00-17:00")
    page.fill("#f-per-day", "3")
    page.click("#preview-button")
    expect(page.locator("#preview-chart rect.bar-planned")).to_have_count(1)
    expect(page.locator("#preview-summary")).to_contain_text(
        "1 email: 3 a day, Mon\u2013Fri, 09:00\u201312:00 and 13:00\u201317:00, UTC"
    )


def test_cancel_one_email_with_a_keyboard_and_a_confirmation(
    page: Page, shared_sendqueue: Sendqueue
) -> None:
    app = shared_sendqueue
    page.goto(f"{app.url}/")
    campaign = api(
        page,
        "POST",
        f"{app.url}/api/campaigns",
        data={
            "name": "Keyboard",
            "recipients": [{"email": f"k{i}@example.com"} for i in range(3)],
            "templates": {"subject": "S", "body": "B"},
            "policy": {"timezone": "UTC", "start": "2099-01-05T09:00:00Z"},
        },
    )
    cid = campaign["id"]
    provision(page, app.url, cid)
    page.goto(f"{app.url}/campaigns/{cid}")
    expect(page.locator("#tasks tr")).to_have_count(3)
    dialog = page.locator("#confirm-dialog")

    button = page.locator('#tasks tr[data-task-id$="-0"] [data-cancel-task]')
    button.focus()
    page.keyboard.press("Enter")
    expect(dialog).to_be_visible()
    expect(page.locator("#confirm-message")).to_contain_text("k0@example.com")
    # the modal keeps the page behind it inert: Tab visits the dialog's buttons (and the
    # browser's own controls, where the page shows as body) and nothing else of the page
    visited = set()
    for _ in range(6):
        page.keyboard.press("Tab")
        visited.add(page.evaluate(FOCUSED_IN_DIALOG))
    assert visited <= {"confirm", "cancel", "outside-page"}, visited
    assert {"confirm", "cancel"} <= visited, visited
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    expect(page.locator('#tasks tr[data-task-id$="-0"]')).to_have_attribute("data-state", "Pending")
    assert page.evaluate("() => document.activeElement.hasAttribute('data-cancel-task')")

    page.keyboard.press("Enter")
    expect(dialog).to_be_visible()
    page.locator("#confirm-ok").focus()
    page.keyboard.press("Enter")
    expect(page.locator('#tasks tr[data-task-id$="-0"]')).to_have_attribute(
        "data-state", "Cancelled"
    )
    expect(page.locator('.counts [data-count="Cancelled"]')).to_have_text("1")
    expect(page.locator('#tasks tr[data-task-id$="-0"] [data-cancel-task]')).to_have_count(0)


def test_a_confirmation_is_answered_by_its_own_dialog_not_an_earlier_close(
    page: Page, shared_sendqueue: Sendqueue
) -> None:
    """The dialog's close event is queued, and input can overtake it: in a loaded CI run the
    keyboard test's second confirmation was answered "no" by the first one's close, arriving
    while the second was open. Such a late close (dispatched here by hand) answers nothing;
    the open confirmation is answered by its own buttons."""
    page.goto(f"{shared_sendqueue.url}/")
    answers = page.evaluate(
        """async () => {
            const dialog = document.getElementById("confirm-dialog");
            const pending = sq.confirm("question", "Yes");
            dialog.dispatchEvent(new Event("close"));
            await new Promise((resolve) => setTimeout(resolve, 50));
            const stillOpen = dialog.open;
            document.getElementById("confirm-ok").click();
            return [stillOpen, await pending, dialog.open];
        }"""
    )
    assert answers == [True, True, False]


def test_a_refusal_from_the_api_is_shown_inline(page: Page, shared_sendqueue: Sendqueue) -> None:
    app = shared_sendqueue
    page.goto(f"{app.url}/")
    campaign = api(
        page,
        "POST",
        f"{app.url}/api/campaigns",
        data={
            "name": "Refused",
            "recipients": [{"email": "r@example.com"}],
            "templates": {"subject": "S", "body": "B"},
            "policy": {"timezone": "UTC", "start": "2099-01-05T09:00:00Z"},
        },
    )
    cid = campaign["id"]
    provision(page, app.url, cid)
    # no stream and frozen timers: the page cannot learn of the cancel below by itself
    page.clock.install()
    page.route("**/events*", lambda route: route.abort())
    page.goto(f"{app.url}/campaigns/{cid}")
    expect(page.locator('[data-action="pause"]')).to_be_visible()
    api(page, "POST", f"{app.url}/api/campaigns/{cid}/cancel")  # "in another tab"
    page.locator('[data-action="pause"]').click()
    error = page.locator("#action-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("cancelled")
    expect(page.locator("#campaign-state .badge")).to_have_text("active")


def test_phone_layout_scrolls_neither_the_page_nor_the_emails(
    page: Page, shared_sendqueue: Sendqueue
) -> None:
    app = shared_sendqueue
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{app.url}/")
    campaign = api(
        page,
        "POST",
        f"{app.url}/api/campaigns",
        data={
            "name": "Phone",
            "recipients": [{"email": f"a-rather-long-address-{i}@example.com"} for i in range(3)],
            "templates": {"subject": "A subject that is not short at all", "body": "B"},
            "policy": {"timezone": "UTC", "start": "2099-01-05T09:00:00Z"},
        },
    )
    provision(page, app.url, campaign["id"])
    for path in ("/", f"/campaigns/{campaign['id']}", "/campaigns/new", "/dead-letters"):
        page.goto(f"{app.url}{path}")
        page.wait_for_load_state("load")
        overflow = page.evaluate(
            "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, f"{path} is wider than the phone by {overflow}px"
    page.goto(f"{app.url}/campaigns/{campaign['id']}")
    expect(page.locator("#tasks tr")).to_have_count(3)
    # the emails are a stack of cards that fits the phone: nothing to scroll sideways
    emails = page.locator("#tasks-table").locator("xpath=..")
    assert emails.evaluate("(el) => el.scrollWidth <= el.clientWidth")
    assert page.locator("#tasks tr").first.evaluate("(el) => getComputedStyle(el).display") == (
        "grid"
    )


def _dead_letters(scheduler_url: str, count: int, *, error: str = f"store down {IMG}") -> None:
    """Make ``count`` dead letters in the app's execution layer: schedules whose invocation
    fails (``error``), with no retries left (the real embedded dispatcher, run here for a
    moment)."""
    scheduler = EmbeddedScheduler(scheduler_url, retry_backoff=0.0)
    stop = threading.Event()

    def explode(payload: Mapping[str, str]) -> None:
        raise RuntimeError(f"{error} for {payload['task_id']}")

    try:
        due = datetime.now(UTC).replace(tzinfo=None)
        for i in range(count):
            scheduler.create(
                f"sq-dead-{i}.0", "sq-dead", due, "UTC", {"task_id": f"dead-{i}"}, f"tok{i}", 0
            )
        thread = threading.Thread(target=scheduler.run, args=(explode, stop), daemon=True)
        thread.start()
        deadline = time.monotonic() + 15
        while len(scheduler.dead_letters()) < count:
            assert time.monotonic() < deadline, "no dead letters after 15 s"
            time.sleep(0.05)
        stop.set()
        thread.join(15)
    finally:
        scheduler.close()


def test_dead_letters_redrive_one_and_all(page: Page, shared_sendqueue: Sendqueue) -> None:
    app = shared_sendqueue
    _dead_letters(app.env["SENDQUEUE_SCHEDULER_URL"], 3)
    page.goto(f"{app.url}/dead-letters")
    rows = page.locator("#dead-letters tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.first.locator(".error-text")).to_contain_text(IMG)
    _assert_no_injection(page)

    rows.first.locator("[data-redrive]").click()
    expect(rows).to_have_count(2)
    expect(page.locator("#dlq-status")).to_contain_text("1 dead letter redriven as sq-dead-")
    page.click("#redrive-all")
    expect(rows).to_have_count(0)
    expect(page.locator("#dlq-empty")).to_be_visible()
    expect(page.locator("#redrive-all")).to_be_disabled()
    assert api(page, "GET", f"{app.url}/api/dead-letters")["dead_letters"] == []


def test_assets_never_turn_data_into_markup() -> None:
    """The scripts build the DOM from text only, and the templates carry no inline script,
    style or event handler (the CSP would refuse them) and never switch escaping off."""
    web = Path(sendqueue.web.__file__).parent
    for script in (web / "static").glob("*.js"):
        code = re.sub(r"/\*.*?\*/|//[^\n]*", "", script.read_text(), flags=re.S)
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in code, f"{script.name} uses {sink}"
        assert "new Function" not in code, script.name
    for template in (web / "templates").glob("*.html"):
        text = template.read_text()
        assert not re.search(r"\sstyle=|<script(?![^>]*\ssrc=)|\son[a-z]+=", text), template.name
        assert not re.search(r"\|\s*safe|autoescape\s+false|Markup\(", text), template.name


def test_suppression_page_adds_and_removes_and_a_campaign_counts_them(
    page: Page, shared_sendqueue: Sendqueue
) -> None:
    app = shared_sendqueue
    address = f"supp-{time.monotonic_ns()}@example.com"
    page.goto(f"{app.url}/suppressions")
    before = int(page.locator("#supp-total").get_attribute("data-count") or "")
    page.fill("#supp-email", address.upper())
    page.select_option("#supp-reason", "unsubscribed")
    page.keyboard.press("Enter")
    row = page.locator(f'#suppressions tr[data-email="{address}"]')
    expect(row).to_contain_text("unsubscribed")
    expect(page.locator("#supp-status")).to_contain_text(f"{address} suppressed")
    expect(page.locator("#supp-total")).to_have_text(plural(before + 1, "address", "addresses"))
    page.fill("#supp-email", IMG)  # refused, and shown as text
    page.click("#supp-add button[type=submit]")
    expect(page.locator("#supp-error")).to_contain_text("Not suppressed")
    expect(page.locator("#supp-email")).to_have_attribute("aria-invalid", "true")
    _assert_no_injection(page)

    # a campaign with that recipient: its email is created cancelled, and the page counts it
    created = api(
        page, "POST", f"{app.url}/api/campaigns",
        data={
            "name": "Suppressed",
            "recipients": [{"email": address}, {"email": "kept@example.com"}],
            "templates": {"subject": "Hi", "body": "Hello"},
            "policy": {"timezone": "UTC", "start": "2099-01-05T09:00:00Z"},
        },
    )  # fmt: skip
    cid = str(created["id"])
    provision(page, app.url, cid)
    page.goto(f"{app.url}/campaigns/{cid}")
    expect(page.locator("#campaign-suppressed")).to_have_text("1")
    expect(page.locator('#tasks tr[data-state="Cancelled"]')).to_contain_text(
        "suppressed: unsubscribed"
    )

    page.goto(f"{app.url}/suppressions")
    row.locator("[data-remove]").click()
    expect(row).to_have_count(0)
    expect(page.locator("#supp-status")).to_contain_text(f"{address} removed")
    listed = api(page, "GET", f"{app.url}/api/suppressions?limit=1000")["suppressions"]
    assert address not in [e["email"] for e in listed]
