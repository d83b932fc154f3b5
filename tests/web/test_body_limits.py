"""Template and JSON body bounds through the API and the CLI (issue 17, Medium 2 and Low 1).

The service-level bounds are in tests/unit/test_template_limits.py; here: the answers a client
gets (a 4xx naming the field, never a 500) and the CLI's one line with exit 2.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sendqueue.cli import app as cli_app
from tests.web.conftest import Web

NESTED = {
    "for x25": "{% for a in x %}" * 25 + "{% endfor %}" * 25,
    "if x120": "{% if x %}" * 120 + "{% endif %}" * 120,
    "paren x200": "{{ " + "(" * 200 + "x" + ")" * 200 + " }}",
    "string x5000": "{{ x" + "|string" * 5000 + " }}",
}
PATHS = ["/api/campaigns", "/api/campaigns/preview"]


def payload(**templates: str) -> dict[str, Any]:
    return {
        "name": "News",
        "recipients": [{"email": "ada@example.com", "name": "Ada", "x": "ab"}],
        "templates": {"subject": "Hi", "body": "B", **templates},
    }


def post_json(web: Web, path: str, body: str | bytes) -> Any:
    return web.client.post(path, content=body, headers={"content-type": "application/json"})


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("source", NESTED.values(), ids=NESTED.keys())
def test_nested_templates_are_a_422_naming_the_part(web: Web, path: str, source: str) -> None:
    json_answer = web.client.post(path, json=payload(html=source))
    form_answer = web.client.post(
        path,
        data={"name": "News", "subject": source},
        files={"file": ("r.csv", b"email,body\nada@example.com,B\n", "text/csv")},
    )

    assert json_answer.status_code == 422, json_answer.text
    assert json_answer.json()["error"]["field"] == "html"
    assert form_answer.status_code == 422, form_answer.text
    assert form_answer.json()["error"]["field"] == "subject"
    assert web.container.store.list_campaigns() == []


def test_the_huge_subject_template_is_refused_at_once(web: Web) -> None:
    body = json.dumps(payload(subject="{{a}}" * 300_000))  # 1.5 MB
    started = time.monotonic()

    answer = post_json(web, "/api/campaigns/preview", body)

    assert time.monotonic() - started < 2
    assert answer.status_code == 422
    assert answer.json()["error"]["field"] == "subject"


def test_a_template_within_the_field_cap_but_past_the_template_cap_names_the_part(
    web: Web,
) -> None:
    answer = web.client.post("/api/campaigns/preview", json=payload(body="b" * 70_000))

    assert answer.status_code == 422
    error = answer.json()["error"]
    assert error["field"] == "body"
    assert "65536 bytes" in error["reason"]


@pytest.mark.parametrize(
    "source",
    [
        "{{ 'x'*200000000 }}",
        "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}",
        "{{ range(100000)|length }}",
    ],
    ids=["repeat", "nested-loops", "range"],
)
def test_render_bounds_answer_422_naming_the_row_and_part(web: Web, source: str) -> None:
    started = time.monotonic()

    answer = web.client.post("/api/campaigns/preview", json=payload(body=source))

    assert time.monotonic() - started < 5
    assert answer.status_code == 422, answer.text
    (problem,) = answer.json()["error"]["errors"]
    assert (problem["field"], problem["row"]) == ("body", 2)


def test_template_limits_come_from_the_settings(make_web: Callable[..., Web]) -> None:
    web = make_web(max_template_bytes=1024, template_max_range=10)

    too_big = web.client.post("/api/campaigns/preview", json=payload(body="b" * 1100))
    too_long = web.client.post(
        "/api/campaigns/preview", json=payload(body="{{ range(11)|length }}")
    )

    assert too_big.json()["error"]["field"] == "body"
    assert "1024 bytes" in too_big.json()["error"]["reason"]
    assert "range() of more than 10 numbers" in too_long.json()["error"]["errors"][0]["reason"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_non_finite_numbers_are_refused_naming_the_field(web: Web, path: str, number: str) -> None:
    row = f'{{"email": "ada@example.com", "age": {number}}}'
    in_row = f'{{"name": "N", "recipients": [{{"email": "b@example.com"}}, {row}]}}'
    in_policy = f'{{"name": "N", "recipients": [], "policy": {{"jitter_seconds": {number}}}}}'

    row_answer = post_json(web, path, in_row)
    policy_answer = post_json(web, path, in_policy)

    assert row_answer.status_code == 422, row_answer.text
    (error,) = row_answer.json()["error"]["errors"]
    assert (error["field"], error["row"]) == ("age", 3)
    assert "not a finite number" in error["reason"]
    assert policy_answer.status_code == 422
    assert policy_answer.json()["error"]["field"] == "jitter_seconds"
    assert web.container.store.list_campaigns() == []


def test_finite_numbers_still_become_text(web: Web) -> None:
    body = '{"name": "N", "recipients": [{"email": "ada@example.com", "age": 1.5e3}],'
    body += ' "templates": {"subject": "{{ age }}", "body": "B"}}'

    answer = post_json(web, "/api/campaigns", body)

    assert answer.status_code == 201, answer.text
    (recipient,) = web.container.store.list_recipients(answer.json()["id"])
    assert recipient.subject == "1500.0"


@pytest.mark.parametrize("field", ["name", "from", "subject", "html", "timezone"])
def test_every_json_field_outside_the_rows_is_capped(web: Web, field: str) -> None:
    body = payload()
    big = "a" * (512 * 1024 + 1)
    if field in ("subject", "html"):
        body["templates"][field] = big
    elif field == "timezone":
        body["policy"] = {"timezone": big}
    else:
        body[field] = big

    answer = web.client.post("/api/campaigns/preview", json=body)

    assert answer.status_code == 422
    error = answer.json()["error"]
    assert error["field"] == field
    assert "longer than 524288 bytes" in error["reason"]


def test_malformed_and_too_deep_json_is_a_422_on_the_body(web: Web) -> None:
    for raw in ('{"name": ', "[" * 100_000 + "]" * 100_000, '{"n": 1' + "0" * 5000 + "}"):
        answer = post_json(web, "/api/campaigns/preview", raw)
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"]["field"] == "body"


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    for key in list(os.environ):
        if key.startswith("SENDQUEUE_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SENDQUEUE_DATABASE_URL", f"sqlite:///{tmp_path / 'store.db'}")
    monkeypatch.setenv("SENDQUEUE_SCHEDULER_URL", f"sqlite:///{tmp_path / 'scheduler.db'}")
    monkeypatch.setenv("SENDQUEUE_MAILER", f"maildir:{tmp_path / 'outbox'}")
    (tmp_path / "r.csv").write_text("email,x\nada@example.com,ab\n")
    return CliRunner()


@pytest.mark.parametrize("option", ["--subject", "--body-file", "--html-file"])
@pytest.mark.parametrize("source", NESTED.values(), ids=NESTED.keys())
def test_the_cli_answers_a_nested_template_with_one_line_and_exit_2(
    cli: CliRunner, tmp_path: Path, option: str, source: str
) -> None:
    args = ["campaign", "create", "--name", "N", "--recipients", "r.csv", "--subject", "s"]
    if option == "--subject":
        args[-1] = source
    else:
        (tmp_path / "t.txt").write_text(source)
        args += ["--body-file", "t.txt"] if option == "--body-file" else ["--html-file", "t.txt"]

    result = cli.invoke(cli_app, args)

    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    part = {"--subject": "subject", "--body-file": "body", "--html-file": "html"}[option]
    assert len(lines) == 1 and lines[0].startswith(f"error: {part}"), result.stderr
    assert "Traceback" not in result.output


def test_the_cli_refuses_a_runaway_template_as_a_row_problem(
    cli: CliRunner, tmp_path: Path
) -> None:
    (tmp_path / "t.txt").write_text("{{ 'x'*200000000 }}")

    args = ["campaign", "create", "--name", "N", "--recipients", "r.csv", "--subject", "s"]
    result = cli.invoke(cli_app, [*args, "--body-file", "t.txt"])

    assert result.exit_code == 2, result.output
    assert "(*) would be longer than 100000 characters" in result.stderr
