"""axe-core on every page, at a desktop and a phone width: no serious or critical violation.

axe-core comes from npm, pinned in tests/e2e/axe/package-lock.json and installed by the
Makefile's dev install (``npm ci``), never at test time. Without it the test skips on a laptop
and fails in CI (``SENDQUEUE_REQUIRE_SERVICES=1``), like a missing Chromium.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from playwright.sync_api import expect

from sendqueue.adapters.sql import open_store
from sendqueue.domain.lifecycle import TaskState
from sendqueue.domain.webhooks import DeliveryRecord
from sendqueue.ports.webhooks import WebhookStore
from tests.conftest import missing
from tests.e2e.conftest import Sendqueue, api, provision
from tests.e2e.test_pages import _dead_letters

if TYPE_CHECKING:
    from playwright.sync_api import FilePayload, Page, ViewportSize

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e")]

AXE = Path(__file__).parent / "axe" / "node_modules" / "axe-core" / "axe.min.js"
TOKEN = "e2e-axe-token-0123456789"
SIZES: dict[str, ViewportSize] = {
    "desktop": {"width": 1280, "height": 800},
    "phone": {"width": 390, "height": 844},
}
# Each size in the light scheme, and the desktop in the dark one (app.css has both palettes).
VARIANTS = [("desktop", "light"), ("phone", "light"), ("desktop", "dark")]
BLOCKING = ("serious", "critical")
# axe's whole rule set (WCAG 2.0-2.2 A/AA and best practices), results reduced to what a
# report needs: each violation with its impact and the elements it found.
RUN_AXE = """async () => {
  const result = await axe.run(document, {resultTypes: ["violations"]});
  return result.violations.map((v) => ({
    id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.map((n) => ({target: n.target.join(" "), summary: n.failureSummary})),
  }));
}"""


@pytest.fixture(scope="module")
def axe_script() -> Path:
    if not AXE.exists():
        missing(f"{AXE} not found: run `make .venv/.dev-installed` (npm ci in tests/e2e/axe)")
    return AXE


def _report(found: dict[str, list[dict[str, Any]]]) -> str:
    lines = []
    for where, violations in found.items():
        for v in violations:
            lines.append(f"{where}: [{v['impact']}] {v['id']}: {v['help']}")
            for node in v["nodes"]:
                summary = re.sub(r"\s+", " ", node["summary"] or "")
                lines.append(f"    {node['target']}: {summary}")
    return "\n".join(lines)


def _audit(page: Page, where: str, found: dict[str, list[dict[str, Any]]]) -> None:
    """Run axe on the page as it is now; keep its violations under ``where``."""
    violations: list[dict[str, Any]] = page.evaluate(RUN_AXE)
    found[where] = violations


def _campaign_in_several_states(page: Page, app: Sendqueue) -> str:
    """A provisioned campaign whose emails are Pending, Running, Finished, Failed and
    Cancelled (set in the store's own files, as a worker would)."""
    created = api(
        page,
        "POST",
        f"{app.url}/api/campaigns",
        data={
            "name": "Accessible",
            "recipients": [{"email": f"a{i}@example.com", "name": f"R {i}"} for i in range(6)],
            "templates": {"subject": "Hi {{ name }}", "body": "Hello"},
            "policy": {"timezone": "UTC", "start": "2099-01-05T09:00:00Z"},
        },
    )
    cid = str(created["id"])
    provision(page, app.url, cid)
    now = datetime.now(UTC)
    store = open_store(app.database_url)
    try:
        running, finished, failed = TaskState.RUNNING, TaskState.FINISHED, TaskState.FAILED
        for position in (1, 2, 3):
            assert store.transition(f"{cid}-{position}", TaskState.PENDING, running, at=now)
        assert store.transition(f"{cid}-2", running, finished, at=now, changes={"sent_at": now})
        assert store.transition(
            f"{cid}-3", running, failed, at=now, changes={"error": "550 mailbox unavailable"}
        )
    finally:
        store.close()
    api(page, "POST", f"{app.url}/api/campaigns/{cid}/tasks/{cid}-4/cancel")
    return cid


def _csv(rows: list[str]) -> FilePayload:
    return {"name": "r.csv", "mimeType": "text/csv", "buffer": ("\n".join(rows) + "\n").encode()}


def _audit_webhooks(page: Page, app: Sendqueue, found: dict[str, list[dict[str, Any]]]) -> None:
    """The Webhooks page empty, with a refused URL, with the secret shown; an endpoint's page
    with a delivery log of attempts that worked and one that failed (written in the store's
    own file, as the worker would), and its page of older attempts."""
    page.goto(f"{app.url}/webhooks")
    _audit(page, "webhooks (none)", found)
    page.fill("#w-url", "not a url")
    page.click("#webhook-add-button")
    expect(page.locator("#err-add-url")).to_be_visible()
    _audit(page, "webhooks (errors)", found)
    page.fill("#w-url", "https://hooks.example.com/sendqueue/a-rather-long-path-of-an-endpoint")
    page.check('#webhook-add input[value="email.sent"]')
    page.check('#webhook-add input[name="campaigns"]')
    page.click("#webhook-add-button")
    expect(page.locator("#secret-panel")).to_be_visible()
    expect(page.locator("#webhooks [data-webhook-id]")).to_have_count(1)
    _audit(page, "webhooks (secret shown)", found)
    hid = page.locator("#webhooks [data-webhook-id]").get_attribute("data-webhook-id") or ""
    now = datetime.now(UTC)
    store = open_store(app.database_url)
    try:
        cast(WebhookStore, store).record_deliveries(
            [DeliveryRecord(hid, f"evt_{n}", "email.sent", now, 1, 40, 204) for n in range(2, 30)]
            + [
                DeliveryRecord(hid, "evt_1", "email.sent", now, 1, 812, 500, "HTTP 500"),
                DeliveryRecord(hid, "evt_1", "email.sent", now, 2, 95, 204),
            ]
        )
    finally:
        store.close()
    page.goto(f"{app.url}/webhooks/{hid}")
    expect(page.locator("#deliveries tbody tr")).to_have_count(25)
    page.locator("summary").click()
    _audit(page, "webhook (delivery log)", found)
    page.get_by_role("link", name="Older attempts").click()
    expect(page.locator("#deliveries tbody tr")).to_have_count(5)
    expect(page.get_by_role("link", name="Newest attempts")).to_be_visible()
    expect(page.locator("#older-attempts")).to_have_count(0)
    _audit(page, "webhook (older attempts)", found)


@pytest.mark.parametrize(("size", "scheme"), VARIANTS, ids=[f"{s}-{c}" for s, c in VARIANTS])
def test_every_page_has_no_serious_violation(
    page: Page, sendqueue: Callable[..., Sendqueue], axe_script: Path, size: str, scheme: str
) -> None:
    app = sendqueue(token=TOKEN)
    page.set_viewport_size(SIZES[size])
    page.emulate_media(color_scheme="dark" if scheme == "dark" else "light")
    # An init script, not a <script> tag: the pages' CSP (script-src 'self') stays on and
    # refuses an injected inline script, but not what the browser runs before the page.
    page.context.add_init_script(path=str(axe_script))
    found: dict[str, list[dict[str, Any]]] = {}

    page.goto(f"{app.url}/login")
    _audit(page, "login", found)
    page.fill("#token", "wrong-token-of-some-length")
    page.click("#login-form button[type=submit]")
    expect(page.locator("#login-error")).to_be_visible()
    _audit(page, "login (refused)", found)
    page.fill("#token", TOKEN)
    page.click("#login-form button[type=submit]")
    expect(page).to_have_url(f"{app.url}/")
    _audit(page, "campaigns (none)", found)

    cid = _campaign_in_several_states(page, app)
    page.goto(f"{app.url}/")
    expect(page.locator("#campaigns tbody tr")).to_have_count(1)
    _audit(page, "campaigns", found)

    page.goto(f"{app.url}/campaigns/{cid}")
    expect(page.locator("#connection")).to_have_attribute("data-connection", "live")
    for state in ("Pending", "Running", "Finished", "Failed", "Cancelled"):
        expect(page.locator(f'#tasks tr[data-state="{state}"]').first).to_be_visible()
    _audit(page, "campaign", found)

    page.goto(f"{app.url}/campaigns/new")
    _audit(page, "new", found)
    page.set_input_files("#f-file", files=[_csv(["email", "x@example.com", "not-an-address"])])
    page.fill("#f-name", "Preview")
    page.fill("#f-subject", "S")
    page.fill("#f-body", "B")
    page.fill("#f-timezone", "UTC")
    page.click("#create-button")  # a bad row: the errors next to the field and in a list
    expect(page.locator("#row-errors li")).to_have_count(1)
    expect(page.locator("#err-file")).to_be_visible()
    _audit(page, "new (errors)", found)
    page.set_input_files("#f-file", files=[_csv(["email", "x@example.com", "y@example.com"])])
    page.click("#preview-button")
    expect(page.locator("#preview")).to_be_visible()
    _audit(page, "new (preview)", found)

    _dead_letters(app.env["SENDQUEUE_SCHEDULER_URL"], 2)
    page.goto(f"{app.url}/dead-letters")
    expect(page.locator("#dead-letters tbody tr")).to_have_count(2)
    _audit(page, "dead letters", found)

    page.goto(f"{app.url}/suppressions")
    _audit(page, "suppressions (none)", found)
    page.fill("#supp-email", "Bounced@Example.com")
    page.select_option("#supp-reason", "bounced")
    page.click("#supp-add button[type=submit]")
    expect(page.locator("#suppressions tbody tr")).to_have_count(1)
    page.fill("#supp-email", "not-an-address")
    page.click("#supp-add button[type=submit]")
    expect(page.locator("#supp-error")).to_be_visible()
    _audit(page, "suppressions", found)

    page.goto(f"{app.url}/senders")
    _audit(page, "senders (none)", found)
    page.fill("#s-email", "not-an-address")
    page.click("#sender-add-button")
    expect(page.locator("#err-email")).to_be_visible()
    _audit(page, "senders (errors)", found)
    page.fill("#s-email", "sender@example.com")
    page.fill("#s-warmup-start", "2")
    page.fill("#s-warmup-step", "3")
    page.click("#sender-add-button")
    expect(page.locator("#senders [data-sender-id]")).to_have_count(1)
    expect(page.locator("#senders .usage-chart g.day")).to_have_count(14)
    _audit(page, "senders", found)
    page.goto(f"{app.url}/campaigns/new")
    expect(page.locator('#f-senders input[name="senders"]')).to_have_count(1)
    _audit(page, "new (senders)", found)

    _audit_webhooks(page, app, found)

    response = page.goto(f"{app.url}/campaigns/cnotacampaign")
    assert response is not None and response.status == 404
    _audit(page, "error page", found)

    counts = {where: len(v) for where, v in found.items()}
    print(f"axe violations per page, {size} {SIZES[size]}, {scheme}: {json.dumps(counts)}")
    if any(found.values()):
        print(_report(found))
    blocking = {
        where: [v for v in violations if v["impact"] in BLOCKING]
        for where, violations in found.items()
    }
    assert not any(blocking.values()), (
        f"serious or critical accessibility violations ({size}, {scheme}):\n{_report(blocking)}"
    )
