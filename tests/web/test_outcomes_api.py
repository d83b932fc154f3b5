"""The API of issue 14's outcomes and campaign options: a campaign created with
``stop_on_reply`` and ``unsubscribe_footer`` (JSON and the form) carries them, a bad value is a
422 naming the field and writes nothing, and task rows and campaign views show outcomes and
their counts. On the real SQLite store."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from sendqueue.domain.lifecycle import TaskOutcome
from sendqueue.ports import FeedbackStore
from tests.web.conftest import Web
from tests.web.test_api import POLICY_FORM, _error, _nothing_written

ROWS = [{"email": "a@example.com", "subject": "s", "body": "b"}]
CSV = b"email,name,subject,body\na@example.com,A,S,B\n"


def test_a_json_create_carries_the_options(web: Web) -> None:
    data = web.create(1, stop_on_reply="campaign", unsubscribe_footer=True)
    assert (data["stop_on_reply"], data["unsubscribe_footer"]) == ("campaign", True)
    shown = web.client.get(f"/api/campaigns/{data['id']}").json()
    assert (shown["stop_on_reply"], shown["unsubscribe_footer"]) == ("campaign", True)
    listed = web.client.get("/api/campaigns").json()["campaigns"]
    assert [(c["stop_on_reply"], c["unsubscribe_footer"]) for c in listed] == [("campaign", True)]


def test_the_options_default_to_sender_and_no_footer(web: Web) -> None:
    data = web.create(1)
    assert (data["stop_on_reply"], data["unsubscribe_footer"]) == ("sender", False)
    assert data["outcomes"] == {o.value: 0 for o in TaskOutcome}


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"stop_on_reply": "always"}, "stop_on_reply"),
        ({"stop_on_reply": None}, "stop_on_reply"),
        ({"unsubscribe_footer": "yes"}, "unsubscribe_footer"),
        ({"unsubscribe_footer": 1}, "unsubscribe_footer"),
    ],
)
def test_a_bad_json_option_names_its_field_and_writes_nothing(
    web: Web, options: dict[str, Any], field: str
) -> None:
    body = {"name": "x", "recipients": ROWS, **options}
    error = _error(web.client.post("/api/campaigns", json=body), 422)
    assert error["field"] == field
    _nothing_written(web)


def test_the_form_carries_the_select_and_the_checkbox(web: Web) -> None:
    response = web.client.post(
        "/api/campaigns",
        data={**POLICY_FORM, "name": "form", "stop_on_reply": "off", "unsubscribe_footer": "on"},
        files={"file": ("r.csv", CSV, "text/csv")},
    )
    assert response.status_code == 201, response.text
    assert (response.json()["stop_on_reply"], response.json()["unsubscribe_footer"]) == (
        "off",
        True,
    )
    # an unchecked box is left out of the form: no footer
    response = web.client.post(
        "/api/campaigns",
        data={**POLICY_FORM, "name": "plain", "stop_on_reply": "campaign"},
        files={"file": ("r.csv", CSV, "text/csv")},
    )
    assert (response.json()["stop_on_reply"], response.json()["unsubscribe_footer"]) == (
        "campaign",
        False,
    )


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"stop_on_reply": "never"}, "stop_on_reply"),
        ({"unsubscribe_footer": "maybe"}, "unsubscribe_footer"),
    ],
)
def test_a_bad_form_option_names_its_field_and_writes_nothing(
    web: Web, fields: dict[str, str], field: str
) -> None:
    response = web.client.post(
        "/api/campaigns",
        data={**POLICY_FORM, "name": "form", **fields},
        files={"file": ("r.csv", CSV, "text/csv")},
    )
    assert _error(response, 422)["field"] == field
    _nothing_written(web)


def test_task_rows_and_the_campaign_show_outcomes(web: Web) -> None:
    cid = web.active(3)
    web.clock.advance(60)
    assert web.fire_due() == 3
    tasks = web.client.get(f"/api/campaigns/{cid}/tasks").json()["tasks"]
    assert all(t["state"] == "Finished" for t in tasks)
    feedback: FeedbackStore = web.container.store
    at = web.clock.now() + timedelta(minutes=3)
    assert feedback.set_outcome(
        tasks[0]["id"], TaskOutcome.BOUNCED, detail="5.1.1 user unknown", at=at
    )
    assert feedback.set_outcome(tasks[1]["id"], TaskOutcome.REPLIED, detail="Re: s", at=at)

    rows = {t["id"]: t for t in web.client.get(f"/api/campaigns/{cid}/tasks").json()["tasks"]}
    bounced = rows[tasks[0]["id"]]
    assert (bounced["state"], bounced["outcome"], bounced["outcome_detail"]) == (
        "Finished",
        "bounced",
        "5.1.1 user unknown",
    )
    assert bounced["outcome_at"] == "2026-12-01T08:04:00Z"
    assert rows[tasks[1]["id"]]["outcome"] == "replied"
    campaign = web.client.get(f"/api/campaigns/{cid}").json()
    assert campaign["outcomes"]["bounced"] == 1
    assert campaign["outcomes"]["replied"] == 1
    assert campaign["counts"]["Finished"] == 3  # outcomes never move a state
    assert sum(campaign["outcomes"].values()) == sum(
        1 for t in rows.values() if t["outcome"] is not None
    )

    page = web.client.get(f"/campaigns/{cid}").text
    assert 'data-outcome="bounced"' in page
    assert "bounced: 5.1.1 user unknown" in page
    assert 'data-outcome-count="bounced">1<' in page
    assert "1 bounced, 1 replied" in web.client.get("/").text

    # the change log carries both outcome changes, as the live page reads them
    entries = [
        e
        for e in web.container.store.changes_after(0, campaign_id=cid)
        if e.note and e.note.startswith("outcome: ")
    ]
    assert [(e.from_state, e.to_state, e.note) for e in entries] == [
        ("Finished", "Finished", "outcome: bounced"),
        ("Finished", "Finished", "outcome: replied"),
    ]
