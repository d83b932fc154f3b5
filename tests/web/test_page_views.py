"""What the HTML pages say, over HTTP: times with their zone, a local-time campaign's rows, the
page of one email, no empty cards, where a login lands and the HTML error page."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from sendqueue.domain.lifecycle import CampaignState, TaskOutcome, TaskState
from sendqueue.domain.models import TaskChanges
from tests.web.conftest import TOKEN, Web

HTML = {"Accept": "text/html,application/xhtml+xml"}


def _local_campaign(web: Web) -> dict[str, Any]:
    """An active local-time campaign over two senders: recipients in Tokyo, New York and
    (no zone of their own) the campaign's Berlin."""
    for email in ("anna@example.com", "bob@example.com"):
        added = web.client.post("/api/senders", json={"email": email, "daily_cap": 10})
        assert added.status_code == 201, added.text
    created = web.create(
        0,
        recipients=[
            {"email": "ny@example.com", "name": "New York", "timezone": "America/New_York"},
            {"email": "tokyo@example.com", "name": "Tokyo", "timezone": "Asia/Tokyo"},
            {"email": "berlin@example.com", "name": "Berlin"},
        ],
        policy={"timezone": "Europe/Berlin", "windows": ["09:00-17:00"], "per_day": 20},
        senders=["anna@example.com", "bob@example.com"],
        local_time=True,
    )
    assert web.container.provisioner.provision(created["id"]).status == "done"
    return created


def test_a_local_time_campaign_says_so_and_shows_each_recipients_zone_and_time(web: Web) -> None:
    cid = _local_campaign(web)["id"]
    page = web.client.get(f"/campaigns/{cid}").text
    assert "in each recipient&#39;s local time (Europe/Berlin where unknown" in page
    tasks = {t["email"]: t for t in web.client.get(f"/api/campaigns/{cid}/tasks").json()["tasks"]}
    assert tasks["tokyo@example.com"]["timezone"] == "Asia/Tokyo"
    assert tasks["berlin@example.com"]["timezone"] is None
    # Tokyo's row: the send in Berlin's time, with its abbreviation, and 09:00 in Tokyo
    row = _row(page, f"{cid}-1")
    assert re.search(r'<span class="nowrap">2026-12-0\d 01:00</span> CET</time>', row), row
    assert re.search(r'<span class="nowrap">2026-12-0\d 09:00</span> Asia/Tokyo</span>', row)
    assert "from <span" in row and ("anna@example.com" in row or "bob@example.com" in row)
    berlin = _row(page, f"{cid}-2")
    assert re.search(r'<span class="nowrap">2026-12-0\d 09:00</span> Europe/Berlin</span>', berlin)
    # the next send has its zone; the page carries the zone's abbreviations for its scripts
    assert re.search(r'<time id="next-send" datetime="[^"]+Z">2026-12-0\d \d\d:\d\d CE', page)
    assert 'data-zone-names="{&#34;Europe/Berlin&#34;:{&#34;120&#34;:&#34;CEST&#34;' in page


def _row(page: str, task_id: str) -> str:
    start = page.index(f'<tr data-task-id="{task_id}"')
    return page[start : page.index("</tr>", start)]


def test_the_previews_list_sends_in_time_order_with_their_zone(web: Web) -> None:
    created = _local_campaign(web)
    stored = web.client.get(f"/api/campaigns/{created['id']}/preview").json()
    body = {
        "name": "draft",
        "recipients": [
            {"email": "ny@example.com", "timezone": "America/New_York"},
            {"email": "tokyo@example.com", "timezone": "Asia/Tokyo"},
            {"email": "berlin@example.com"},
        ],
        "templates": {"subject": "S", "body": "B"},
        "policy": {"timezone": "Europe/Berlin", "windows": ["09:00-17:00"], "per_day": 20},
        "senders": ["anna@example.com", "bob@example.com"],
        "local_time": True,
    }
    draft = web.client.post("/api/campaigns/preview", json=body).json()
    for plan in (stored, draft):
        sends = plan["sends"]
        assert [s["send_at"] for s in sends] == sorted(s["send_at"] for s in sends)
        assert {s["email"]: s["zone"] for s in sends} == {
            "ny@example.com": "America/New_York",
            "tokyo@example.com": "Asia/Tokyo",
            "berlin@example.com": "Europe/Berlin",
        }
        # the first send is the first day's first: the form's summary and its day table agree
        assert sends[0]["local"] == plan["days"][0]["first"]
        assert plan["local_time"] is True
        assert "local time" in plan["policy_text"]
        assert set(plan["zone_names"]) == {
            "Europe/Berlin", "America/New_York", "Asia/Tokyo",
        }  # fmt: skip


def test_the_page_of_one_email_shows_every_field(web: Web) -> None:
    cid = _local_campaign(web)["id"]
    task_id = f"{cid}-1"
    store: Any = web.container.store
    at = web.clock.now()
    assert store.transition(task_id, TaskState.PENDING, TaskState.RUNNING, at=at)
    sent: TaskChanges = {
        "sent_at": at + timedelta(seconds=5), "message_id": "<m1.abc@example.com>",
        "outcome": TaskOutcome.BOUNCED, "outcome_detail": "5.1.1 user unknown",
        "outcome_at": at + timedelta(minutes=3), "attempts": 1,
    }  # fmt: skip
    assert store.transition(task_id, TaskState.RUNNING, TaskState.FINISHED, at=at, changes=sent)

    response = web.client.get(f"/campaigns/{cid}/emails/{task_id}")
    assert response.status_code == 200
    page = response.text
    for text in (
        "tokyo@example.com", ">Finished<", "bounced", "5.1.1 user unknown",
        "&lt;m1.abc@example.com&gt;", "2026-12-01 09:00:05 CET", "Asia/Tokyo", ">1<", task_id,
        "Subject", "Hi Tokyo",
    ):  # fmt: skip
        assert text in page, text
    assert "microsecond" not in page and not re.search(r"\d\d:\d\d:\d\d\.\d{6}", page)
    # the row links to it
    campaign_page = web.client.get(f"/campaigns/{cid}").text
    assert f'href="/campaigns/{cid}/emails/{task_id}"' in campaign_page

    other = web.create(1)["id"]
    wrong = web.client.get(f"/campaigns/{other}/emails/{task_id}", headers=HTML)
    assert wrong.status_code == 404 and "<h1>Not found</h1>" in wrong.text


def test_a_completed_campaign_shows_no_empty_actions_card(web: Web) -> None:
    cid = web.active(1)
    active = web.client.get(f"/campaigns/{cid}").text
    assert re.search(r'id="actions-card"\s*>', active)
    store: Any = web.container.store
    at = web.clock.now()
    assert store.transition(f"{cid}-0", TaskState.PENDING, TaskState.RUNNING, at=at)
    assert store.transition(f"{cid}-0", TaskState.RUNNING, TaskState.FINISHED, at=at)
    assert store.set_campaign_state(cid, {CampaignState.ACTIVE}, CampaignState.COMPLETED, at=at)
    done = web.client.get(f"/campaigns/{cid}").text
    assert re.search(r'id="actions-card"\s*hidden', done)
    assert '<span class="muted" id="next-send-zone" hidden>' in done


def test_lists_show_human_times_with_their_zone(web: Web) -> None:
    web.clock.set(web.clock.now() + timedelta(microseconds=123456))
    added = web.client.post("/api/suppressions", json={"email": "gone@example.com"})
    assert added.status_code == 201
    page = web.client.get("/suppressions").text
    assert ">2026-12-01 08:00 UTC</time>" in page
    assert re.search(r'<time class="nowrap" datetime="2026-12-01T08:00:00\.123456Z">', page)


def test_campaigns_is_the_list_and_a_login_lands_there(make_web: Any) -> None:
    web = make_web(api_token=TOKEN)
    client = web.client
    denied = client.get("/campaigns?x=1", headers=HTML)
    assert denied.headers["location"] == "/login?next=%2Fcampaigns%3Fx%3D1"
    form = client.get("/login?next=%2Fcampaigns%3Fx%3D1")
    assert 'name="next" value="/campaigns?x=1"' in form.text
    csrf = client.cookies.get("sq_csrf")
    login = client.post(
        "/login", data={"token": TOKEN, "csrf_token": csrf, "next": "/campaigns?x=1"}
    )
    assert (login.status_code, login.headers["location"]) == (303, "/campaigns?x=1")
    listed = client.get("/campaigns?x=1", headers=HTML)
    assert (listed.status_code, listed.headers["location"]) == (303, "/?x=1")
    assert "<h1>Campaigns</h1>" in client.get("/", headers=HTML).text


def test_an_unknown_page_is_the_html_error_page_and_the_api_stays_json(web: Web) -> None:
    page = web.client.get("/no/such/page", headers=HTML)
    assert page.status_code == 404
    assert page.headers["content-type"].startswith("text/html")
    assert "<h1>Not found</h1>" in page.text and "There is no such page." in page.text
    for path, headers in (("/no/such/page", {"Accept": "application/json"}), ("/api/nope", HTML)):
        answer = web.client.get(path, headers=headers)
        assert answer.status_code == 404
        assert answer.json()["error"]["status"] == 404
    wrong_method = web.client.get("/logout", headers=HTML)
    assert wrong_method.status_code == 405 and "<h1>Method Not Allowed</h1>" in wrong_method.text
    assert web.client.get("/static/nothing.css", headers=HTML).status_code == 404
