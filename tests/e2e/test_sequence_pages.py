"""Sequences in real Chromium: a 3-step campaign built in the new-campaign form (steps added
and removed, previewed per day and step, created), the campaign page's Step column and funnel
as a real worker sends step 1, the form without JavaScript, and axe on those pages."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from playwright.sync_api import expect

from sendqueue.adapters.sql import open_store
from tests.e2e.conftest import Sendqueue, api
from tests.e2e.test_accessibility import (  # noqa: F401 (axe_script: a fixture)
    BLOCKING,
    SIZES,
    VARIANTS,
    _audit,
    _report,
    axe_script,
)

if TYPE_CHECKING:
    from playwright.sync_api import Browser, FilePayload, Page

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e")]

CSV: FilePayload = {
    "name": "people.csv",
    "mimeType": "text/csv",
    "buffer": b"email,name\nann@example.com,Ann\nben@example.com,Ben\ncid@example.com,Cid\n",
}


def _fill_sequence(page: Page, name: str) -> None:
    """Step 1 in the message fields; steps 2 and 3 added with the button, a third added and
    removed again (its follower moves up a slot)."""
    page.set_input_files("#f-file", files=[CSV])
    page.fill("#f-name", name)
    page.fill("#f-subject", "Hello {{ name }}")
    page.fill("#f-body", "Hi {{ name }}")
    page.fill("#f-timezone", "UTC")
    page.check("#f-day-sat")
    page.check("#f-day-sun")
    page.fill("#f-window-1", "00:00-24:00")
    page.fill("#f-per-day", "10000")
    expect(page.locator("[data-step-slot]:visible")).to_have_count(0)
    for _ in range(3):
        page.click("#add-step")
    expect(page.locator("[data-step-slot]:visible")).to_have_count(3)
    page.fill("#f-step-2-after", "1d")
    page.fill("#f-step-2-text", "A thought I forgot")
    page.fill("#f-step-3-after", "2d")
    page.fill("#f-step-3-text", "Any news, {{ name }}?")
    page.fill("#f-step-4-after", "4h")
    page.fill("#f-step-4-subject", "Last note")
    page.fill("#f-step-4-text", "Bye")
    page.check("#f-step-4-new-thread")
    page.get_by_role("button", name="Remove step 2").click()  # steps 3 and 4 move up
    expect(page.locator("[data-step-slot]:visible")).to_have_count(2)
    expect(page.locator("#f-step-2-after")).to_have_value("2d")
    expect(page.locator("#f-step-3-subject")).to_have_value("Last note")
    expect(page.locator("#f-step-3-new-thread")).to_be_checked()
    expect(page.locator("#f-step-4-after")).to_have_value("")


def test_a_three_step_campaign_built_in_the_form_is_created_and_sends_its_first_step(
    page: Page, sendqueue: Callable[..., Sendqueue]
) -> None:
    app = sendqueue()
    page.goto(f"{app.url}/campaigns/new")
    _fill_sequence(page, "Three steps")

    # a step without a body: refused next to that step's field, the slot named
    page.fill("#f-step-2-text", "")
    page.click("#preview-button")
    error = page.locator('[data-error-for="steps[2].text"]')
    expect(error).to_be_visible()
    expect(page.locator("#f-step-2-text")).to_be_focused()
    page.fill("#f-step-2-text", "Any news, {{ name }}?")

    page.click("#preview-button")
    expect(page.locator("#preview-steps")).to_be_visible()
    heads = page.locator("#preview-steps-table thead th").all_inner_texts()
    assert heads == ["Day", "Step 1", "Step 2 (+2d)", "Step 3 (+4h)", "All"]
    expect(page.locator("#preview-steps-note")).to_contain_text("no one answered")

    page.click("#create-button")
    page.wait_for_url(re.compile(r"/campaigns/c[0-9a-f]+$"))
    cid = page.url.rsplit("/", 1)[1]
    expect(page.locator("#steps-table tbody tr")).to_have_count(3)
    expect(page.locator('#steps-table tr[data-step="2"] td[data-label="Wait"]')).to_have_text("2d")
    expect(page.locator('#steps-table tr[data-step="2"] td[data-label="Subject"]')).to_have_text(
        "Re: Hello {{ name }}"
    )

    expect(page.locator("#connection")).to_have_attribute("data-connection", "live")
    api(page, "POST", f"{app.url}/api/campaigns/{cid}/provision")
    app.start_worker()
    # the funnel follows the live updates: step 1 sent, step 2 made for each recipient
    row = page.locator('#steps-table tr[data-step="1"]')
    expect(row.locator('[data-funnel="sent"]')).to_have_text("3", timeout=30_000)
    expect(page.locator('#steps-table tr[data-step="2"] [data-funnel="made"]')).to_have_text(
        "3", timeout=30_000
    )
    # step 1 goes out now; each recipient's step 2 is made, due two sending days later
    tasks: list[dict[str, Any]] = []
    for _ in range(150):
        tasks = api(page, "GET", f"{app.url}/api/campaigns/{cid}/tasks")["tasks"]
        if sum(1 for t in tasks if t["step"] == 2) == 3:
            break
        page.wait_for_timeout(200)
    assert (
        sorted((t["step"], t["state"]) for t in tasks)
        == [(1, "Finished")] * 3 + [(2, "Pending")] * 3
    ), json.dumps(tasks, indent=1)
    page.reload()
    step2 = page.locator('#tasks tr[data-task-id$="-s2"]')
    expect(step2).to_have_count(3)
    expect(step2.first.locator('[data-field="step"]')).to_have_text("2")
    expect(page.locator("#tasks-table thead th").nth(1)).to_have_text("Step")
    row = page.locator('#steps-table tr[data-step="1"]')
    expect(row.locator('[data-funnel="sent"]')).to_have_text("3")
    row = page.locator('#steps-table tr[data-step="2"]')
    expect(row.locator('[data-funnel="made"]')).to_have_text("3")
    expect(row.locator('[data-funnel="pending"]')).to_have_text("3")
    expect(page.locator('#steps-table tr[data-step="3"] [data-funnel="made"]')).to_have_text("0")


def test_the_form_builds_steps_without_javascript(
    browser: Browser, shared_sendqueue: Sendqueue
) -> None:
    app = shared_sendqueue
    context = browser.new_context(java_script_enabled=False)
    try:
        page = context.new_page()
        page.goto(f"{app.url}/campaigns/new")
        # every slot shows, no button that needs a script
        expect(page.locator("[data-step-slot]:visible")).to_have_count(9)
        expect(page.locator("#add-step")).to_be_hidden()
        page.set_input_files("#f-file", files=[CSV])
        page.fill("#f-name", "No script")
        page.fill("#f-subject", "Hello")
        page.fill("#f-body", "Hi")
        page.fill("#f-start", "2099-01-05T09:00")
        page.fill("#f-step-2-after", "3d")
        page.fill("#f-step-2-text", "Again")
        page.fill("#f-step-3-after", "30m")
        page.fill("#f-step-3-text", "Once more")
        page.click("#create-button")
        created = json.loads(page.locator("body").inner_text())
    finally:
        context.close()
    assert created.get("name") == "No script", created
    store = open_store(app.database_url)
    try:
        steps = store.get_campaign(created["id"]).steps
    finally:
        store.close()
    assert [(s.number, s.text, s.after and s.after.text) for s in steps] == [
        (1, "Hi", None),
        (2, "Again", "3d"),
        (3, "Once more", "30m"),
    ]


@pytest.mark.parametrize(("size", "scheme"), VARIANTS, ids=[f"{s}-{c}" for s, c in VARIANTS])
def test_the_sequence_pages_have_no_serious_violation(
    page: Page,
    sendqueue: Callable[..., Sendqueue],
    axe_script: Path,  # noqa: F811
    size: str,
    scheme: str,
) -> None:
    app = sendqueue()
    page.set_viewport_size(SIZES[size])
    page.emulate_media(color_scheme="dark" if scheme == "dark" else "light")
    page.context.add_init_script(path=str(axe_script))
    found: dict[str, list[dict[str, Any]]] = {}
    page.goto(f"{app.url}/campaigns/new")
    _fill_sequence(page, "Accessible steps")
    _audit(page, "new (steps)", found)
    page.fill("#f-step-2-after", "soon")
    page.click("#preview-button")
    expect(page.locator('[data-error-for="steps[2].after"]')).to_be_visible()
    _audit(page, "new (step error)", found)
    page.fill("#f-step-2-after", "2d")
    page.click("#preview-button")
    expect(page.locator("#preview-steps")).to_be_visible()
    _audit(page, "new (steps preview)", found)
    page.click("#create-button")
    page.wait_for_url(re.compile(r"/campaigns/c[0-9a-f]+$"))
    expect(page.locator("#steps-table")).to_be_visible()
    _audit(page, "campaign (steps)", found)
    page.screenshot(path=str(Path(app.home) / f"campaign-{size}-{scheme}.png"), full_page=True)
    if any(found.values()):
        print(_report(found))
    blocking = {w: [v for v in vs if v["impact"] in BLOCKING] for w, vs in found.items()}
    assert not any(blocking.values()), f"serious or critical violations:\n{_report(blocking)}"
