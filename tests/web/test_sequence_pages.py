"""Sequences in the web app: the new-campaign form's step slots (created, previewed, refused
naming the step), the campaign page's Step column and funnel (one store call still), and the
funnel's counts."""

from __future__ import annotations

import re
from typing import Any

from sendqueue.domain.funnel import StepFunnel, step_funnel
from sendqueue.domain.lifecycle import TaskOutcome, TaskState
from sendqueue.domain.models import task_id
from tests.web.conftest import Web
from tests.web.test_store_calls import Counted, counted  # noqa: F401 (a fixture)

POLICY_FORM = {"timezone": "UTC", "per_day": "10000", "weekdays": "mon-sun",
               "windows": "00:00-24:00"}  # fmt: skip
CSV = b"email,name\nann@example.com,Ann\nben@example.com,Ben\ncid@example.com,Cid\n"
STEP_FORM = {
    "subject": "Hello {{ name }}",
    "body": "Hi {{ name }}",
    "steps[2].after": "1d",
    "steps[2].text": "Any news, {{ name }}?",
    "steps[3].after": "4h",
    "steps[3].subject": "Last note",
    "steps[3].text": "Bye",
    "steps[3].html": "<p>Bye</p>",
    "steps[3].new_thread": "on",
    # the form posts every slot; empty ones are no step
    "steps[4].after": "",
    "steps[4].text": "",
}


def _post(client: Any, path: str, fields: dict[str, str]) -> Any:
    return client.post(
        path,
        data={**POLICY_FORM, "name": "Seq", **fields},
        files={"file": ("people.csv", CSV, "text/csv")},
    )


def _create(web: Web, fields: dict[str, str] = STEP_FORM) -> str:
    response = _post(web.client, "/api/campaigns", fields)
    assert response.status_code == 201, response.text
    cid: str = response.json()["id"]
    return cid


def test_the_form_creates_a_three_step_sequence(web: Web) -> None:
    cid = _create(web)
    steps = web.container.store.get_campaign(cid).steps
    assert [(s.number, s.subject, s.text, s.html, s.after and s.after.text, s.new_thread)
            for s in steps] == [
        (1, "Hello {{ name }}", "Hi {{ name }}", None, None, False),
        (2, None, "Any news, {{ name }}?", None, "1d", False),
        (3, "Last note", "Bye", "<p>Bye</p>", "4h", True),
    ]  # fmt: skip
    # the form's preview shows the load per day and step
    plan = _post(web.client, "/api/campaigns/preview", STEP_FORM).json()
    assert [(s["step"], s.get("after"), s["count"]) for s in plan["steps"]] == [
        (1, None, 3),
        (2, "1d", 3),
        (3, "4h", 3),
    ]
    assert "no one answered" in plan["steps_note"]


def test_a_bad_step_is_refused_naming_it_and_nothing_is_written(web: Web) -> None:
    cases = [
        ({"steps[2].text": "x"}, "steps[2].after"),
        ({"steps[2].after": "3 days", "steps[2].text": "x"}, "steps[2].after"),
        ({"steps[2].after": "2d", "steps[2].subject": "S"}, "steps[2].text"),
        ({"steps[3].after": "2d", "steps[3].text": "x"}, "steps[2].text"),
        # a template that cannot render for the rows: the step as a whole
        ({"steps[2].after": "2d", "steps[2].text": "{{ nope }}"}, "steps[2]"),
    ]
    for fields, field in cases:
        response = _post(web.client, "/api/campaigns", {"subject": "S", "body": "B", **fields})
        assert response.status_code == 422, (fields, response.text)
        assert response.json()["error"]["field"] == field, fields
    # step 1 of a sequence needs the subject above the steps
    no_subject = _post(web.client, "/api/campaigns", {**STEP_FORM, "subject": ""})
    assert no_subject.json()["error"]["field"] == "steps[1].subject"
    assert web.client.get("/api/campaigns").json() in ([], {"campaigns": []})


def test_the_campaign_page_shows_the_step_column_and_the_funnel(web: Web) -> None:
    cid = _create(web)
    assert web.container.provisioner.provision(cid).status == "done"
    web.clock.advance(minutes=5)
    assert web.fire_due() == 3  # step 1 goes out; each recipient's step 2 is made for tomorrow
    cancel = web.client.post(f"/api/campaigns/{cid}/tasks/{task_id(cid, 1, 2)}/cancel")
    assert cancel.status_code == 200, cancel.text
    html = web.client.get(f"/campaigns/{cid}").text
    assert '<th scope="col" class="num">Step</th>' in html
    assert re.search(r'data-label="Step" data-field="step">2<', html)
    funnel = {
        int(step): dict(re.findall(r'data-funnel="(\w+)"[^>]*>(\d+)<', row))
        for step, row in re.findall(r'<tr data-step="(\d)">(.*?)</tr>', html, re.S)
    }
    assert funnel == {
        1: {"made": "3", "sent": "3", "answered": "0", "stopped": "0", "pending": "0",
            "failed": "0"},
        2: {"made": "3", "sent": "0", "answered": "0", "stopped": "1", "pending": "2",
            "failed": "0"},
        3: {"made": "0", "sent": "0", "answered": "0", "stopped": "0", "pending": "0",
            "failed": "0"},
    }  # fmt: skip
    assert "Re: Hello {{ name }}" in html  # step 2's subject, as it goes out
    # the API's campaign read carries the same funnel (what the page's live updates apply)
    funnel_json = web.client.get(f"/api/campaigns/{cid}").json()["funnel"]
    assert [(f["step"], f["made"], f["sent"], f["stopped"], f["pending"]) for f in funnel_json] == [
        (1, 3, 3, 0, 0),
        (2, 3, 0, 1, 2),
        (3, 0, 0, 0, 0),
    ]
    # the API's tasks carry their step
    tasks = web.client.get(f"/api/campaigns/{cid}/tasks").json()["tasks"]
    assert sorted({t["step"] for t in tasks}) == [1, 2]


def test_a_campaign_of_one_email_has_no_step_column_or_funnel(web: Web) -> None:
    cid = web.active()
    html = web.client.get(f"/campaigns/{cid}").text
    assert 'data-field="step"' not in html and 'id="steps-card"' not in html
    assert web.client.get(f"/api/campaigns/{cid}").json()["funnel"] is None


def test_the_sequence_page_is_still_one_store_call(counted: Counted) -> None:  # noqa: F811
    cid = _post(counted.client, "/api/campaigns", STEP_FORM).json()["id"]
    assert counted.container.provisioner.provision(cid).status == "done"
    assert counted.calls_of(f"/campaigns/{cid}") == ["campaign_page"]


def test_the_funnel_counts_answers_and_stops_from_any_source() -> None:
    counts = {
        (1, TaskState.FINISHED, TaskOutcome.ACCEPTED): 5,
        (1, TaskState.FINISHED, TaskOutcome.REPLIED): 2,
        (1, TaskState.FINISHED, TaskOutcome.BOUNCED): 1,
        (1, TaskState.FINISHED, TaskOutcome.UNSUBSCRIBED): 1,
        (1, TaskState.FINISHED, TaskOutcome.COMPLAINED): 1,
        (2, TaskState.CANCELLED, None): 2,
        (2, TaskState.PENDING, None): 3,
        (2, TaskState.RUNNING, None): 1,
        (2, TaskState.FAILED, None): 1,
    }
    assert step_funnel(3, counts) == (
        StepFunnel(1, made=10, sent=10, answered=2, stopped=3),
        StepFunnel(2, made=7, stopped=2, pending=4, failed=1),
        StepFunnel(3),
    )
