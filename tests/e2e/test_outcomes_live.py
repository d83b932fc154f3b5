"""Issue 14 in Chromium: outcomes reach the open campaign page live, and the new-campaign form
sets the reply and unsubscribe options.

The web app runs as ``sendqueue serve --no-worker`` on SQLite files; the test applies feedback
to the same files as the feedback poller would (:class:`FeedbackService` over the store), and
the page learns of it only through the event stream (or its polling fallback), never by a
reload. axe-core audits the changed pages: no serious or critical violation.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from playwright.sync_api import expect

from sendqueue.adapters.clock import SystemClock
from sendqueue.adapters.sql import open_store
from sendqueue.domain.feedback import Feedback, FeedbackKind
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import TaskChanges
from sendqueue.services.feedback.effects import FeedbackService
from tests.e2e.conftest import Sendqueue, api, provision
from tests.e2e.test_accessibility import BLOCKING, _audit, _report, axe_script

if TYPE_CHECKING:
    from playwright.sync_api import FilePayload, Page

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e")]

__all__ = ["axe_script"]  # the fixture, shared with test_accessibility

COUNT = 4


def _sent_campaign(page: Page, app: Sendqueue) -> str:
    """A provisioned campaign whose first three emails are sent (Finished and accepted, as a
    worker leaves them) and whose last is Pending (due in 2099)."""
    created = api(
        page,
        "POST",
        f"{app.url}/api/campaigns",
        data={
            "name": "Feedback",
            "recipients": [{"email": f"f{i}@example.com"} for i in range(COUNT)],
            "templates": {"subject": "S", "body": "B"},
            "policy": {"timezone": "UTC", "start": "2099-01-05T09:00:00Z"},
        },
    )
    cid = str(created["id"])
    provision(page, app.url, cid)
    now = datetime.now(UTC)
    store = open_store(app.database_url)
    try:
        for position in range(COUNT - 1):
            task_id = f"{cid}-{position}"
            assert store.transition(task_id, TaskState.PENDING, TaskState.RUNNING, at=now)
            sent: TaskChanges = {
                "sent_at": now, "outcome": TaskOutcome.ACCEPTED, "outcome_at": now,
            }  # fmt: skip
            assert store.transition(
                task_id, TaskState.RUNNING, TaskState.FINISHED, at=now, changes=sent
            )
    finally:
        store.close()
    return cid


def _apply(app: Sendqueue, *items: Feedback) -> None:
    """Apply feedback to the app's store, as the feedback poller would, in this process."""
    store: Any = open_store(app.database_url)
    try:
        service = FeedbackService(store, store, store, SystemClock(), senders=store)
        for item in items:
            assert service.apply(item).outcome_set, item
    finally:
        store.close()


def _blocking(found: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    return {w: [v for v in vs if v["impact"] in BLOCKING] for w, vs in found.items()}


def test_a_bounce_and_a_reply_show_live_in_the_rows_and_the_counts(
    page: Page, sendqueue: Callable[..., Sendqueue], axe_script: Path
) -> None:
    app = sendqueue()
    page.context.add_init_script(path=str(axe_script))
    page.goto(f"{app.url}/")
    cid = _sent_campaign(page, app)
    page.goto(f"{app.url}/campaigns/{cid}")
    expect(page.locator("#connection")).to_have_attribute("data-connection", "live")
    expect(page.locator('#tasks tr[data-state="Finished"]')).to_have_count(COUNT - 1)
    expect(page.locator('[data-outcome-count="accepted"]')).to_have_text(str(COUNT - 1))
    for name in ("bounced", "replied"):
        expect(page.locator(f'[data-outcome-count="{name}"]')).to_have_text("0")
    # a mark in the page's own window: a reload would drop it
    page.evaluate("() => { window.__sameDocument = true; }")

    bounced, replied = f"{cid}-0", f"{cid}-1"
    now = datetime.now(UTC)
    _apply(
        app,
        Feedback(FeedbackKind.HARD_BOUNCE, now, task_id=bounced, detail="5.1.1 user unknown"),
        Feedback(FeedbackKind.REPLY, now, task_id=replied, detail="Re: S"),
    )

    bounced_cell = page.locator(f'#tasks tr[data-task-id="{bounced}"] [data-field="outcome"]')
    replied_cell = page.locator(f'#tasks tr[data-task-id="{replied}"] [data-field="outcome"]')
    expect(bounced_cell).to_have_attribute("data-outcome", "bounced")
    expect(replied_cell).to_have_attribute("data-outcome", "replied")
    # the refetch the events scheduled brings the detail and the counts
    expect(bounced_cell).to_have_text("bounced: 5.1.1 user unknown")
    expect(replied_cell).to_have_text("replied: Re: S")
    expect(page.locator('[data-outcome-count="bounced"]')).to_have_text("1")
    expect(page.locator('[data-outcome-count="replied"]')).to_have_text("1")
    expect(page.locator('[data-outcome-count="accepted"]')).to_have_text(str(COUNT - 3))
    for name in ("complained", "unsubscribed"):
        expect(page.locator(f'[data-outcome-count="{name}"]')).to_have_text("0")
    # an outcome is not a state move: the rows stay Finished and the state counts stay put
    expect(page.locator('#tasks tr[data-state="Finished"]')).to_have_count(COUNT - 1)
    expect(page.locator('[data-count="Finished"]')).to_have_text(str(COUNT - 1))
    expect(page.locator('[data-count="Pending"]')).to_have_text("1")
    third = page.locator(f'#tasks tr[data-task-id="{cid}-2"] [data-field="outcome"]')
    expect(third).to_have_text("accepted")
    pending = page.locator(f'#tasks tr[data-task-id="{cid}-3"] [data-field="outcome"]')
    expect(pending).to_have_text("")
    assert page.evaluate("() => window.__sameDocument === true"), "the page was reloaded"

    found: dict[str, list[dict[str, Any]]] = {}
    _audit(page, "campaign (outcomes)", found)
    page.goto(f"{app.url}/")
    expect(page.locator(f'tr[data-campaign-id="{cid}"] [data-field="outcomes"]')).to_have_text(
        "1 bounced, 1 replied"
    )
    _audit(page, "campaigns (feedback)", found)
    assert not any(_blocking(found).values()), _report(_blocking(found))


def _csv(rows: list[str]) -> FilePayload:
    return {"name": "r.csv", "mimeType": "text/csv", "buffer": ("\n".join(rows) + "\n").encode()}


def test_the_new_campaign_form_picks_the_options(
    page: Page, sendqueue: Callable[..., Sendqueue], axe_script: Path
) -> None:
    app = sendqueue()
    page.context.add_init_script(path=str(axe_script))
    page.goto(f"{app.url}/campaigns/new")
    # the controls are found by their labels, as a screen reader names them
    scope = page.get_by_label("Stop on reply")
    footer = page.get_by_label("Add an unsubscribe footer")
    expect(scope).to_have_value("sender")
    expect(footer).not_to_be_checked()
    found: dict[str, list[dict[str, Any]]] = {}
    _audit(page, "new", found)

    page.set_input_files("#f-file", files=[_csv(["email", "o@example.com", "p@example.com"])])
    page.fill("#f-name", "Options")
    page.fill("#f-subject", "Hello")
    page.fill("#f-body", "Body")
    page.fill("#f-timezone", "UTC")
    page.fill("#f-start", "2099-01-05T09:00")
    scope.select_option("campaign")
    footer.check()
    page.click("#create-button")
    page.wait_for_url(re.compile(r"/campaigns/c[0-9a-f]+$"))
    cid = page.url.rsplit("/", 1)[1]
    expect(page.locator("#campaign-stop-on-reply")).to_have_attribute("data-value", "campaign")
    expect(page.locator("#campaign-stop-on-reply")).to_have_text("this campaign only")
    expect(page.locator("#campaign-unsubscribe-footer")).to_have_text("on")
    shown = api(page, "GET", f"{app.url}/api/campaigns/{cid}")
    assert (shown["stop_on_reply"], shown["unsubscribe_footer"]) == ("campaign", True)
    _audit(page, "campaign (options)", found)

    # the defaults, left as they are
    page.goto(f"{app.url}/campaigns/new")
    page.set_input_files("#f-file", files=[_csv(["email", "q@example.com"])])
    page.fill("#f-name", "Defaults")
    page.fill("#f-subject", "Hello")
    page.fill("#f-body", "Body")
    page.fill("#f-start", "2099-01-05T09:00")
    page.click("#create-button")
    page.wait_for_url(re.compile(r"/campaigns/c[0-9a-f]+$"))
    expect(page.locator("#campaign-stop-on-reply")).to_have_attribute("data-value", "sender")
    expect(page.locator("#campaign-unsubscribe-footer")).to_have_text("off")
    assert not any(_blocking(found).values()), _report(_blocking(found))
