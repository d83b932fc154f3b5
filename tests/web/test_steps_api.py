"""``/api/campaigns/{id}/steps`` on real SQLite files: a step added (reaching those who
finished), a step's text changed (its Pending emails re-rendered), errors naming the field
with nothing changed, 404 and 409 in the one error shape."""

from __future__ import annotations

from typing import Any

import pytest

from sendqueue.domain.lifecycle import CampaignState, TaskState
from sendqueue.domain.models import task_id
from tests.web.conftest import Web
from tests.web.test_api import _error


def _tasks(web: Web, cid: str, step: int) -> list[Any]:
    return web.container.store.list_tasks(cid, step=step, limit=100)


def test_a_step_added_to_a_completed_campaign_reaches_its_recipients(web: Web) -> None:
    cid = web.active(2)
    web.clock.advance(minutes=5)
    assert web.fire_due() == 2
    assert web.container.store.get_campaign(cid).state is CampaignState.COMPLETED

    response = web.client.post(
        f"/api/campaigns/{cid}/steps",
        json={"text": "Did you see it, {{ name }}?", "after": "30m", "html": "<p>Well?</p>"},
    )

    assert response.status_code == 201, response.text
    assert response.json() == {
        "campaign_id": cid,
        "step": {
            "number": 2, "subject": None, "text": "Did you see it, {{ name }}?",
            "html": "<p>Well?</p>", "after": "30m", "new_thread": False,
        },
        "recipients_reached": 2,
        "reopened": True,
    }  # fmt: skip
    assert web.container.store.get_campaign(cid).state is CampaignState.ACTIVE
    made = web.container.store.get_task(task_id(cid, 1, 2))
    assert made is not None and made.text == "Did you see it, User 1?"
    assert made.subject == "Re: Hello User 1"


def test_a_step_changed_re_renders_its_pending_emails(web: Web) -> None:
    cid = web.active(3)

    response = web.client.patch(
        f"/api/campaigns/{cid}/steps/1", json={"text": "Fresh words, {{ name }}", "html": None}
    )

    assert response.status_code == 200, response.text
    data = response.json()
    assert (data["rerendered"], data["cancelled"]) == (3, 0)
    assert data["step"]["subject"] == "Hello {{ name }}"  # not given: kept
    assert sorted(t.text for t in _tasks(web, cid, 1)) == [
        "Fresh words, User 0", "Fresh words, User 1", "Fresh words, User 2",
    ]  # fmt: skip
    assert all(t.state is TaskState.PENDING for t in _tasks(web, cid, 1))


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("post", "/steps", {"text": "{{ nope }}", "after": "1d"}, "steps[2].text"),
        ("post", "/steps", {"text": "x", "after": "1d", "subject": "{% if %}"}, "steps[2].subject"),
        ("post", "/steps", {"text": "x", "after": "-1d"}, "steps[2].after"),
        ("post", "/steps", {"text": "x"}, "after"),
        ("post", "/steps", {"text": "x", "after": "1d", "colour": "red"}, "colour"),
        ("patch", "/steps/1", {"subject": None}, "steps[1].subject"),
        ("patch", "/steps/1", {"html": "<p>{{ </p>"}, "steps[1].html"),
        ("patch", "/steps/1", {"text": None}, "steps[1].text"),
        ("patch", "/steps/1", {}, "body"),
        ("patch", "/steps/2", {"text": "x"}, "number"),
        ("patch", "/steps/one", {"text": "x"}, "number"),
    ],
)
def test_a_bad_edit_is_a_422_naming_the_field_and_changes_nothing(
    web: Web, method: str, path: str, body: dict[str, Any], field: str
) -> None:
    cid = web.active(2)
    before = web.container.store.get_campaign(cid).steps
    texts = [t.text for t in _tasks(web, cid, 1)]

    response = getattr(web.client, method)(f"/api/campaigns/{cid}{path}", json=body)

    assert _error(response, 422)["field"] == field
    assert web.container.store.get_campaign(cid).steps == before
    assert [t.text for t in _tasks(web, cid, 1)] == texts


def test_an_unknown_campaign_is_a_404_and_a_cancelled_one_a_409(web: Web) -> None:
    body = {"text": "x", "after": "1d"}
    _error(web.client.post("/api/campaigns/nope/steps", json=body), 404)
    cid = web.active(1)
    assert web.client.post(f"/api/campaigns/{cid}/cancel").status_code == 200
    _error(web.client.post(f"/api/campaigns/{cid}/steps", json=body), 409)
    _error(web.client.patch(f"/api/campaigns/{cid}/steps/1", json={"text": "y"}), 409)
