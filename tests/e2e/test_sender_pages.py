"""The sender an email goes out from, in Chromium: a campaign over two senders shows them in its
header and each email's row, the unsubscribe page of an email names its own sender (not the
campaign's From), and axe finds no serious or critical violation on either page.

The server runs in this process (uvicorn in a thread, as in tests/web) over the in-memory
stores, like tests/e2e/test_unsubscribe_page.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from sendqueue.bootstrap import Container
from sendqueue.domain.senders import Sender
from sendqueue.services.templates.render import Templates
from tests.e2e.test_accessibility import BLOCKING, RUN_AXE, SIZES, _report, axe_script
from tests.support.app import T0, fake_app, open_policy
from tests.web.conftest import live_server

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e")]

__all__ = ["axe_script"]  # the fixture, imported for this module

SECRET = "e2e-sender-pages-key-0123456789abcdef"
SENDERS = (
    Sender(id="s0000000000b1", email="bob@example.com", name="Bob Builder"),
    Sender(id="s0000000000a1", email="ann@example.com", name="Doe, Ann"),
)
ROWS = ("email,name\n" + "".join(f"r{i}@example.org,R{i}\n" for i in range(4))).encode()
SHOWN = {s.email: f"{s.name} <{s.email}>" for s in SENDERS}


@pytest.fixture
def campaign() -> Iterator[tuple[Container, str]]:
    app = fake_app(public_url="https://mail.example.com", secret_key=SECRET)
    for sender in SENDERS:
        app.sender_store.add_sender(sender)
    cid = app.campaign_import.create(
        name="Weekly", recipients=ROWS, policy=open_policy(T0),
        from_addr="Sales <sales@example.com>", senders=[s.id for s in SENDERS],
        templates=Templates(subject="From {{ sender.name }}", body="Hi"),
    ).campaign.id  # fmt: skip
    assert app.provisioner.provision(cid).status == "done"
    try:
        yield app, cid
    finally:
        app.close()


def test_the_campaign_and_the_unsubscribe_page_name_the_real_sender(
    page: Page, campaign: tuple[Container, str], axe_script: Path
) -> None:
    app, cid = campaign
    task = app.store.list_tasks(cid, limit=10)[1]
    assert task.sender is not None
    links = app.config.unsubscribe
    assert links is not None
    page.set_viewport_size(SIZES["desktop"])
    page.context.add_init_script(path=str(axe_script))
    found: dict[str, list[dict[str, Any]]] = {}
    with live_server(app) as (base, _):
        page.goto(f"{base}/campaigns/{cid}")
        expect(page.locator("#campaign-from")).to_have_text(", ".join(SHOWN.values()))
        senders = page.locator('#tasks [data-field="sender"]')
        expect(senders).to_have_count(4)
        assert sorted(senders.all_inner_texts()) == sorted(2 * list(SHOWN.values()))
        row = page.locator(f'#tasks tr[data-task-id="{task.id}"]')
        expect(row.locator('[data-field="subject"]')).to_have_text(
            f"From {SHOWN[task.sender].split(' <')[0]}"
        )
        found["campaign"] = page.evaluate(RUN_AXE)

        page.goto(base + urlsplit(links.url(task.id)).path)
        expect(page.get_by_role("heading", level=1)).to_have_text("Unsubscribe?")
        expect(page.locator("main")).to_contain_text(f"Stop the emails from {SHOWN[task.sender]}")
        expect(page.locator("main")).not_to_contain_text("sales@example.com")
        found["unsubscribe"] = page.evaluate(RUN_AXE)
    blocking = {
        where: [v for v in violations if v["impact"] in BLOCKING]
        for where, violations in found.items()
    }
    assert not any(blocking.values()), _report(blocking)
