"""The unsubscribe confirmation page in Chromium (issue 14): a recipient opens the link of an
email, sees whose emails stop, clicks the button and reads the confirmation; opening the link
changes nothing, the click unsubscribes (the recipient's other Pending emails cancelled), no
cookie is set, and axe finds no serious or critical violation on either page.

The server runs in this process (uvicorn in a thread, as in tests/web) with an API token set,
over the in-memory task store (a FeedbackStore already; the SQL stores' side is separate).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from sendqueue.bootstrap import Container
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.suppression import SuppressionReason
from sendqueue.services.templates.render import Templates
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.scheduler import FakeScheduler
from tests.e2e.test_accessibility import BLOCKING, RUN_AXE, SIZES, _report, axe_script
from tests.support.app import T0, fake_app, open_policy
from tests.web.conftest import TOKEN, live_server

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e")]

__all__ = ["axe_script"]  # the fixture, imported for this module

SECRET = "e2e-unsubscribe-key-0123456789abcdef"


def _campaign(app: Container, *, days: int) -> str:
    rows = "".join(f"reader{i}@example.com,Reader {i},Hello\n" for i in range(2))
    cid = app.campaign_import.create(
        name="Weekly",
        recipients=f"email,name,subject\n{rows}".encode(),
        policy=open_policy(start=T0 + timedelta(days=days)),
        from_addr="Weekly News <weekly@example.com>",
        templates=Templates(body="Hi {{ name }}. Unsubscribe: {{ unsubscribe_url }}"),
    ).campaign.id
    assert app.provisioner.provision(cid).status == "done"
    return cid


@pytest.fixture
def sent() -> Iterator[tuple[Container, str, str]]:
    """A container whose first campaign was sent and whose second is still Pending."""
    app = fake_app(public_url="https://mail.example.com", secret_key=SECRET, api_token=TOKEN)
    first = _campaign(app, days=0)
    later = _campaign(app, days=10)
    clock, scheduler = app.clock, app.scheduler
    assert isinstance(clock, FakeClock)
    assert isinstance(scheduler, FakeScheduler)
    clock.advance(hours=1)
    scheduler.fire_due(app.invoke)
    try:
        yield app, first, later
    finally:
        app.close()


def _audit(page: Page, where: str, found: dict[str, list[dict[str, Any]]]) -> None:
    found[where] = page.evaluate(RUN_AXE)


@pytest.mark.parametrize(
    ("size", "scheme"), [("desktop", "light"), ("phone", "dark")], ids=["desktop", "phone-dark"]
)
def test_open_the_link_click_the_button_see_the_confirmation(
    page: Page,
    sent: tuple[Container, str, str],
    axe_script: Path,
    size: str,
    scheme: str,
) -> None:
    app, first, later = sent
    [task] = [t for t in app.store.list_tasks(first, limit=10) if t.email == "reader1@example.com"]
    assert task.state is TaskState.FINISHED
    links = app.config.unsubscribe
    assert links is not None
    path = urlsplit(links.url(task.id)).path
    page.set_viewport_size(SIZES[size])
    page.emulate_media(color_scheme="dark" if scheme == "dark" else "light")
    page.context.add_init_script(path=str(axe_script))
    found: dict[str, list[dict[str, Any]]] = {}
    with live_server(app) as (base, _):
        page.goto(base + path)
        expect(page.get_by_role("heading", level=1)).to_have_text("Unsubscribe?")
        expect(page.locator("main")).to_contain_text("Weekly News <weekly@example.com>")
        expect(page.locator("main")).to_contain_text("r***@example.com")
        _audit(page, "confirm", found)
        assert app.suppressions.count_suppressions() == 0  # opening it changed nothing

        page.get_by_role("button", name="Unsubscribe").click()
        expect(page.get_by_role("heading", level=1)).to_have_text("You are unsubscribed")
        assert page.url == base + path
        _audit(page, "done", found)

        page.reload()  # the link again, later: still says so, with no button
        expect(page.get_by_role("heading", level=1)).to_have_text("You are unsubscribed")
        expect(page.get_by_role("button")).to_have_count(0)
    assert page.context.cookies() == []
    entry = app.suppressions.suppressed([task.email])[task.email]
    assert entry.reason is SuppressionReason.UNSUBSCRIBED
    assert app.store.get_task(task.id).outcome is TaskOutcome.UNSUBSCRIBED  # type: ignore[union-attr]
    pending = {t.email: t for t in app.store.list_tasks(later, limit=10)}
    assert pending[task.email].reason == "suppressed: unsubscribed"
    assert pending["reader0@example.com"].state is TaskState.PENDING
    blocking = {
        where: [v for v in violations if v["impact"] in BLOCKING]
        for where, violations in found.items()
    }
    assert not any(blocking.values()), _report(blocking)
