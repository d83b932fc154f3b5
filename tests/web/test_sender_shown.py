"""The sender an email goes out from, everywhere it is shown: the API's tasks (``sender_name``,
the subject with ``sender.*`` filled in), the campaign's header and emails table, an email's
page, the unsubscribe page, and the mail itself; on real SQLite files."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest

from sendqueue.domain.senders import Sender
from tests.web.conftest import Web

SENDERS = (
    Sender(
        id="s0000000000b1", email="bob@example.com", name="Bob Builder",
        signature_text="Bob\nBuilder & Sons",
    ),
    Sender(
        id="s0000000000a1", email="ann@example.com", name="Doe, Ann",
        signature_text="Ann", signature_html="<em>Ann</em>",
    ),
)  # fmt: skip
NAMES = {s.email: s for s in SENDERS}
TEMPLATES = {
    "subject": "Hi from {{ sender.name }}",
    "body": "Hi {{ name }}\n-- \n{{ sender.signature }}\n",
    "html": "<p>{{ sender.signature }}</p>",
}


@pytest.fixture
def site(make_web: Callable[..., Web]) -> Web:
    web = make_web(
        public_url="https://mail.example.com", secret_key="sender-shown-key-0123456789abcdef"
    )
    for sender in SENDERS:
        web.container.sender_store.add_sender(sender)
    return web


def _campaign(web: Web, count: int = 4, **body: Any) -> tuple[str, list[dict[str, Any]]]:
    """A provisioned campaign of ``count`` recipients; ``from_`` is its From."""
    if "from_" in body:
        body["from"] = body.pop("from_")
    cid: str = web.create(count, templates=TEMPLATES, **body)["id"]
    assert web.container.provisioner.provision(cid).status == "done"
    tasks: list[dict[str, Any]] = web.client.get(f"/api/campaigns/{cid}/tasks").json()["tasks"]
    return cid, tasks


def test_the_api_names_each_emails_sender_and_fills_its_subject(site: Web) -> None:
    _, tasks = _campaign(site, senders=[s.id for s in SENDERS], from_="sales@example.com")

    assert {t["sender"] for t in tasks} == set(NAMES)
    for task in tasks:
        sender = NAMES[task["sender"]]
        assert (task["sender_name"], task["subject"]) == (sender.name, f"Hi from {sender.name}")


def test_a_campaign_without_senders_fills_in_its_from(site: Web) -> None:
    _, tasks = _campaign(site, 1, from_='"Sales, Team" <sales@example.com>')

    (task,) = tasks
    assert task["subject"] == "Hi from Sales, Team"
    assert (task["sender"], task["sender_name"]) == ('"Sales, Team" <sales@example.com>', None)


def test_the_campaign_page_lists_its_senders_and_each_rows_sender(site: Web) -> None:
    cid, tasks = _campaign(site, senders=[s.id for s in SENDERS], from_="sales@example.com")

    page = site.client.get(f"/campaigns/{cid}").text

    shown = ", ".join(html.escape(f"{s.name} <{s.email}>") for s in SENDERS)
    assert f'<span id="campaign-from">{shown}</span>' in page
    assert "sales@example.com" not in page
    for task in tasks:
        sender = NAMES[task["sender"]]
        assert html.escape(f"Hi from {sender.name}") in page
    for sender in SENDERS:
        row = html.escape(f"{sender.name} <{sender.email}>")
        assert page.count(f'data-field="sender">{row}<') == 2  # the senders took turns


def test_an_emails_page_shows_the_message_its_sender_sends(site: Web) -> None:
    cid, tasks = _campaign(site, senders=[s.id for s in SENDERS])

    for task in tasks:
        sender = NAMES[task["sender"]]
        page = site.client.get(f"/campaigns/{cid}/emails/{task['id']}").text
        assert html.escape(f"-- \n{sender.signature_text}\n") in page
        assert "sendqueue:sender" not in page


def test_the_unsubscribe_page_names_the_sender_the_email_came_from(site: Web) -> None:
    _, tasks = _campaign(site, senders=[s.id for s in SENDERS], from_="sales@example.com")
    links = site.container.config.unsubscribe
    assert links is not None

    for task in tasks:
        sender = NAMES[task["sender"]]
        page = site.client.get(urlsplit(links.url(task["id"])).path)
        assert page.status_code == 200
        assert f"<strong>{html.escape(f'{sender.name} <{sender.email}>')}</strong>" in page.text
        assert "sales@example.com" not in page.text


def test_each_email_goes_out_from_its_sender_with_its_signature(site: Web) -> None:
    _campaign(site, senders=[s.id for s in SENDERS])
    for _ in range(5):  # each send on time: a minute at a time
        site.clock.advance(60)
        site.fire_due()

    assert len(site.mailer.sent) == 4
    for message in site.mailer.sent:
        sender = NAMES[message.from_addr]
        assert message.from_name == sender.name
        assert message.subject == f"Hi from {sender.name}"
        assert message.text.startswith(f"Hi User {message.to_addr[4]}\n-- \n")
        assert f"-- \n{sender.signature_text}\n" in message.text
        html_signature = sender.signature_html or "Bob<br>\nBuilder &amp; Sons"
        assert message.html is not None and f"<p>{html_signature}</p>" in message.html


@pytest.mark.parametrize("part", ["subject", "body", "html"])
def test_a_template_that_misuses_sender_is_refused_naming_its_part(site: Web, part: str) -> None:
    templates = {**TEMPLATES, part: "{{ sender.name | upper }}"}
    response = site.client.post(
        "/api/campaigns",
        json={
            "name": "News",
            "recipients": [{"email": "user0@example.com"}],
            "templates": templates,
            "policy": {"timezone": "UTC", "per_day": 10, "weekdays": "mon-sun",
                       "windows": ["00:00-24:00"]},
        },
    )  # fmt: skip

    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == part
    assert site.client.get("/api/campaigns").json()["campaigns"] == []
