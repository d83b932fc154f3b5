"""Sequences over the HTTP API: a campaign created with ``steps``, read back with its steps and
their counts, its tasks listed per step; every bad step refused naming ``steps[k].field``, and
nothing written."""

from __future__ import annotations

from typing import Any

import pytest

from sendqueue.domain.steps import Delay, DelayUnit, Step
from tests.web.conftest import Web

STEPS: list[dict[str, Any]] = [
    {"subject": "Hello {{ name }}", "body": "Hi {{ name }}", "html": "<p>Hi {{ name }}</p>"},
    {"after": "30m", "body": "Did you see it, {{ name }}?"},
    {"after": "2d", "subject": "Last one", "body": "Bye {{ name }}", "new_thread": True},
]


def _error(response: Any) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


def test_a_sequence_is_created_read_back_and_listed_per_step(web: Web) -> None:
    data = web.create(3, templates={}, steps=STEPS)
    cid = data["id"]
    assert [(s["number"], s["after"], s["subject"], s["new_thread"]) for s in data["steps"]] == [
        (1, None, "Hello {{ name }}", False),
        (2, "30m", "Re: Hello {{ name }}", False),
        (3, "2d", "Last one", True),
    ]
    assert all(s["counts"]["Pending"] == 0 for s in data["steps"])
    assert web.container.store.get_campaign(cid).steps == (
        Step(1, "Hello {{ name }}", "Hi {{ name }}", "<p>Hi {{ name }}</p>", None),
        Step(2, None, "Did you see it, {{ name }}?", None, Delay(30, DelayUnit.MINUTES)),
        Step(3, "Last one", "Bye {{ name }}", None, Delay(2, DelayUnit.DAYS), True),
    )
    assert web.container.provisioner.provision(cid).status == "done"
    web.clock.advance(60)
    assert web.fire_due() == 3  # step 1 goes out; each send makes that recipient's step 2
    got = web.client.get(f"/api/campaigns/{cid}").json()
    counts = [(s["number"], s["counts"]["Finished"], s["counts"]["Pending"]) for s in got["steps"]]
    assert counts == [(1, 3, 0), (2, 0, 3), (3, 0, 0)]
    assert got["steps"][0]["outcomes"]["accepted"] == 3
    assert got["counts"]["Pending"] == 3
    listed = web.client.get(f"/api/campaigns/{cid}/tasks", params={"step": 2}).json()["tasks"]
    assert [(t["position"], t["step"], t["state"]) for t in listed] == [
        (0, 2, "Pending"),
        (1, 2, "Pending"),
        (2, 2, "Pending"),
    ]
    assert {t["subject"] for t in listed} == {"Re: Hello User 0", "Re: Hello User 1",
                                              "Re: Hello User 2"}  # fmt: skip
    first = web.client.get(f"/api/campaigns/{cid}/tasks", params={"step": 1}).json()["tasks"]
    assert [t["step"] for t in first] == [1, 1, 1]
    # pages never end between one recipient's steps: the cursor (a position) skips none
    seen: list[tuple[int, int]] = []
    cursor = -1
    while cursor is not None:
        params = {"limit": 3, "after": cursor}
        page = web.client.get(f"/api/campaigns/{cid}/tasks", params=params).json()
        seen += [(t["position"], t["step"]) for t in page["tasks"]]
        cursor = page["next"]
    assert sorted(seen) == [(p, s) for p in range(3) for s in (1, 2)]
    assert len(seen) == 6
    # a campaign listing does not read the steps
    assert web.client.get("/api/campaigns").json()["campaigns"][0]["steps"] is None


def test_a_campaign_from_templates_shows_its_one_step(web: Web) -> None:
    data = web.create(2)
    assert [(s["number"], s["subject"], s["after"]) for s in data["steps"]] == [
        (1, "Hello {{ name }}", None)
    ]


def test_a_campaign_whose_rows_carry_their_emails_shows_one_step_from_its_counts(
    web: Web,
) -> None:
    rows = [{"email": f"u{i}@example.com", "subject": "S", "body": "B"} for i in range(2)]
    data = web.create(templates={}, recipients=rows)
    assert web.container.store.get_campaign(data["id"]).steps == ()
    assert web.container.provisioner.provision(data["id"]).status == "done"
    got = web.client.get(f"/api/campaigns/{data['id']}").json()
    assert [(s["number"], s["subject"], s["counts"]["Pending"]) for s in got["steps"]] == [
        (1, None, 2)
    ]


def _later(**step: Any) -> list[dict[str, Any]]:
    return [STEPS[0], {"after": "1d", "body": "b", **step}]


@pytest.mark.parametrize(
    ("steps", "field"),
    [
        ([], "steps"),
        ("steps", "steps"),
        ([{"body": "b"}], "steps[1].subject"),
        ([{**STEPS[0], "after": "1d"}], "steps[1].after"),
        ([{**STEPS[0], "new_thread": True}], "steps[1].new_thread"),
        ([STEPS[0], {"body": "b"}], "steps[2].after"),
        (_later(after="3x"), "steps[2].after"),
        (_later(after="0d"), "steps[2].after"),
        (_later(after=3), "steps[2].after"),
        (_later(body="{{ oops"), "steps[2].body"),
        (_later(body="  "), "steps[2].body"),
        (_later(html="{% if %}"), "steps[2].html"),
        (_later(subject=""), "steps[2].subject"),
        (_later(new_thread="yes"), "steps[2].new_thread"),
        (_later(body_file="b.txt"), "steps[2].body_file"),
        ([STEPS[0], {"after": "1d"}], "steps[2].body"),
        ([STEPS[0]] + [{"after": "1d", "body": "b"}] * 10, "steps"),
    ],
)
def test_a_bad_step_is_refused_naming_it_and_nothing_is_written(
    web: Web, steps: Any, field: str
) -> None:
    body = {"name": "x", "recipients": [{"email": "a@example.com"}], "steps": steps}
    for path in ("/api/campaigns", "/api/campaigns/preview"):
        error = _error(web.client.post(path, json=body))
        assert error["field"] == field, error
        assert error["reason"]
    assert web.container.store.list_campaigns() == []


def test_steps_and_templates_together_are_refused_naming_steps(web: Web) -> None:
    body = {
        "name": "x",
        "recipients": [{"email": "a@example.com"}],
        "templates": {"subject": "s", "body": "b"},
        "steps": STEPS,
    }
    assert _error(web.client.post("/api/campaigns", json=body))["field"] == "steps"
    assert web.container.store.list_campaigns() == []


@pytest.mark.parametrize("step", ["0", "11", "two"])
def test_a_bad_step_filter_is_refused_naming_step(web: Web, step: str) -> None:
    cid = web.active(1)
    error = _error(web.client.get(f"/api/campaigns/{cid}/tasks", params={"step": step}))
    assert error["field"] == "step"


def test_openapi_documents_steps(web: Web) -> None:
    schema = web.client.get("/openapi.json").json()
    components = schema["components"]["schemas"]
    assert "steps" in components["CampaignBody"]["properties"]
    assert set(components["StepBody"]["properties"]) == {
        "subject", "body", "html", "after", "new_thread"
    }  # fmt: skip
    assert "StepView" in components
    params = schema["paths"]["/api/campaigns/{campaign_id}/tasks"]["get"]["parameters"]
    assert "step" in {p["name"] for p in params}


def test_a_step_template_over_the_field_cap_is_named_by_its_step(web: Web) -> None:
    big = "a" * (512 * 1024 + 1)
    body = {"name": "x", "recipients": [{"email": "a@example.com"}], "steps": _later(body=big)}
    error = _error(web.client.post("/api/campaigns", json=body))
    assert error["field"] == "steps[2].body"
    assert "longer than 524288 bytes" in error["reason"]
    assert web.container.store.list_campaigns() == []


def test_a_long_list_of_steps_is_refused_by_its_length_with_one_error(web: Web) -> None:
    # each entry invalid: read one by one, every one would be an error of the 422's body
    body = {"name": "x", "recipients": [{"email": "a@example.com"}], "steps": [{}] * 5_000}
    response = web.client.post("/api/campaigns", json=body)
    error = _error(response)
    assert error["field"] == "steps"
    assert len(response.content) < 2_000
