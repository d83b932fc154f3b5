"""With SENDQUEUE_API_TOKEN set: the login form, and the CSRF refusal of a forged POST."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import Sendqueue

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e")]

TOKEN = "e2e-token-0123456789abcdef"
STATUS_OF_POST = """([url, headers]) => fetch(url, {method: "POST", headers: headers})
  .then((response) => response.status)"""


def test_login_then_csrf_refusal(page: Page, sendqueue: Callable[..., Sendqueue]) -> None:
    app = sendqueue(token=TOKEN)

    # every page sends a stranger to the login form, and the API answers 401
    page.goto(f"{app.url}/dead-letters")
    expect(page).to_have_url(re.compile(r"/login\?next="))
    assert page.evaluate(STATUS_OF_POST, [f"{app.url}/api/campaigns/x/pause", {}]) == 401
    assert page.request.get(f"{app.url}/api/campaigns").status == 401

    # a wrong token is refused
    page.fill("#token", "not-the-token-at-all")
    page.click("#login-form button[type=submit]")
    expect(page.locator("#login-error")).to_be_visible()
    expect(page).to_have_url(re.compile(r"/login(\?|$)"))
    expect(page.locator("#token")).to_have_attribute("aria-invalid", "true")
    assert not [c for c in page.context.cookies() if c["name"] == "sq_session"]

    # the right one logs in and goes where the user was headed
    page.fill("#token", TOKEN)
    page.click("#login-form button[type=submit]")
    expect(page).to_have_url(f"{app.url}/dead-letters")
    expect(page.locator("h1")).to_have_text("Dead letters")
    session = [c for c in page.context.cookies() if c["name"] == "sq_session"]
    assert session and session[0]["httpOnly"] and session[0]["sameSite"] == "Strict"

    # logged in, a POST from the page without the CSRF token is refused ...
    url = f"{app.url}/api/campaigns/cunknown/pause"
    assert page.evaluate(STATUS_OF_POST, [url, {}]) == 403
    assert page.evaluate(STATUS_OF_POST, [url, {"X-CSRF-Token": "x" * 43}]) == 403
    # ... and with it, the request gets through to the route (an unknown campaign)
    token = page.evaluate("() => window.sq.csrfToken()")
    meta = page.get_attribute('meta[name="csrf-token"]', "content")
    assert token and token == meta
    assert page.evaluate(STATUS_OF_POST, [url, {"X-CSRF-Token": token}]) == 404

    # logging out ends the session
    page.click(".logout button")
    expect(page).to_have_url(re.compile(r"/login$"))
    page.goto(f"{app.url}/")
    expect(page).to_have_url(re.compile(r"/login"))


def _log_in(page: Page) -> None:
    page.fill("#token", TOKEN)
    page.click("#login-form button[type=submit]")


def test_login_goes_back_to_the_page_asked_for_and_never_elsewhere(
    page: Page, sendqueue: Callable[..., Sendqueue]
) -> None:
    app = sendqueue(token=TOKEN)

    # /campaigns is the list: asked for without a session, it is where the login lands
    page.goto(f"{app.url}/campaigns")
    expect(page).to_have_url(f"{app.url}/login?next=%2Fcampaigns")
    _log_in(page)
    expect(page).to_have_url(f"{app.url}/")
    expect(page.locator("h1")).to_have_text("Campaigns")

    # a page the app does not have: the HTML error page, never the API's JSON
    page.click(".logout button")
    page.goto(f"{app.url}/campaign/list?x=1")
    expect(page).to_have_url(re.compile(r"/login\?next=%2Fcampaign%2Flist%3Fx%3D1$"))
    _log_in(page)
    expect(page).to_have_url(f"{app.url}/campaign/list?x=1")
    expect(page.locator("h1")).to_have_text("Not found")
    expect(page.locator("main")).to_contain_text("There is no such page.")
    assert '"error"' not in page.content()

    # a next that names another site (however spelt) or the login itself lands on the list
    for target in (
        "//evil.example/x",
        "https://evil.example/",
        "/\\evil.example",
        "%2F%2Fevil.example",
        "/%09/evil.example",
        "javascript:alert(document.domain)",
        "/login",
    ):
        page.click(".logout button")
        page.goto(f"{app.url}/login?next={target}")
        _log_in(page)
        expect(page).to_have_url(f"{app.url}/")
        expect(page.locator("h1")).to_have_text("Campaigns")
