"""read_steps_file: a sequence's steps from YAML or JSON, every problem named by its step and
key, the templates checked as `campaign create` checks its own."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.steps import Delay, DelayUnit, Step
from sendqueue.services.campaigns.steps_file import (
    MAX_STEPS_FILE_BYTES,
    read_steps_file,
    steps_from_entries,
)
from sendqueue.services.templates.render import TemplateLimits

YAML_EXAMPLE = """\
steps:
  - subject: "Hello {{ name }}"
    body_file: first.txt
    html_file: first.html
  - after: 3d
    body: |
      Hi {{ name }}, just checking in.
  - after: " 4H "
    subject: Last call
    body_file: mails/last.txt
    new_thread: true
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def refused(path: Path, limits: TemplateLimits | None = None) -> InvalidField:
    with pytest.raises(InvalidField) as exc:
        read_steps_file(path, limits)
    return exc.value


@pytest.fixture
def bodies(tmp_path: Path) -> Path:
    write(tmp_path, "first.txt", "Dear {{ name }},\nhello.\n")
    write(tmp_path, "first.html", "<p>Dear {{ name }}</p>\n")
    write(tmp_path, "mails/last.txt", "\ufeffLast one, {{ name }}.\n")
    return tmp_path


def test_a_yaml_file_becomes_checked_steps(bodies: Path) -> None:
    steps = read_steps_file(write(bodies, "steps.yaml", YAML_EXAMPLE))
    assert steps == [
        Step(1, "Hello {{ name }}", "Dear {{ name }},\nhello.\n", "<p>Dear {{ name }}</p>\n", None),
        Step(2, None, "Hi {{ name }}, just checking in.\n", None, Delay(3, DelayUnit.DAYS)),
        # a BOM at the start of a body file is dropped
        Step(3, "Last call", "Last one, {{ name }}.\n", None, Delay(4, DelayUnit.HOURS), True),
    ]


def test_a_list_at_the_top_and_json_read_the_same(bodies: Path) -> None:
    top_list = textwrap.dedent(YAML_EXAMPLE.removeprefix("steps:\n"))
    listed = write(bodies, "steps.yml", top_list)
    as_json = [
        {"subject": "Hello {{ name }}", "body_file": "first.txt", "html_file": "first.html"},
        {"after": "3d", "body": "Hi {{ name }}, just checking in.\n"},
        {
            "after": " 4H ",
            "subject": "Last call",
            "body_file": "mails/last.txt",
            "new_thread": True,
        },
    ]
    from_yaml = read_steps_file(write(bodies, "steps.yaml", YAML_EXAMPLE))
    assert read_steps_file(listed) == from_yaml
    assert read_steps_file(write(bodies, "steps.JSON", json.dumps(as_json))) == from_yaml
    assert read_steps_file(write(bodies, "s.json", json.dumps({"steps": as_json}))) == from_yaml


def test_files_are_found_next_to_the_steps_file_not_the_working_directory(
    bodies: Path, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = write(bodies, "steps.yaml", YAML_EXAMPLE)
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    assert read_steps_file(str(path))[0].text == "Dear {{ name }},\nhello.\n"


def test_yaml_anchors_and_merge_keys_work(tmp_path: Path) -> None:
    text = (
        "- {subject: Hi, body: &text Hello}\n"
        "- &later {after: 2d, body: *text}\n"
        "- {<<: *later, after: 4h}\n"
    )
    steps = read_steps_file(write(tmp_path, "steps.yaml", text))
    assert [(s.text, s.after) for s in steps] == [
        ("Hello", None),
        ("Hello", Delay(2, DelayUnit.DAYS)),
        ("Hello", Delay(4, DelayUnit.HOURS)),
    ]


def test_a_single_step_is_a_sequence(tmp_path: Path) -> None:
    path = write(tmp_path, "one.yaml", "- {subject: Hi, body: Hello}\n")
    assert read_steps_file(path) == [Step(1, "Hi", "Hello", None, None)]


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        # the shape of the file
        ("", "steps", "expected a list of steps"),
        ("[]", "steps", "expected a list of steps"),
        ("steps: []", "steps", "expected a list of steps"),
        ("just text", "steps", "expected a list of steps"),
        ("{step: []}", "step", "unknown key"),
        ("{steps: [], name: x}", "name", "unknown key"),
        ("{}", "steps", "names no steps"),
        ("- [subject, body]", "steps[1]", "expected a mapping"),
        ("- {subject: Hi, body: x}\n- {after: 1d, body: x, bdy: y}", "steps[2].bdy", "unknown key"),
        ("- {subject: Hi, body: x, 3: y}", "steps[1]", "unknown key"),
        ("- {subject: Hi, body: x}\n- {after: 1d, body: x, body: y}", "steps_file", "twice"),
        ("- {subject: Hi, body: [x}", "steps_file", "not valid YAML"),
        # types: YAML reads these unquoted as numbers, booleans, dates
        ("- {subject: 2026-12-24, body: x}", "steps[1].subject", "quote it"),
        ("- {subject: Hi, body: 42}", "steps[1].body", "expected text"),
        ("- {subject: Hi, body: x}\n- {after: 3, body: x}", "steps[2].after", "written as text"),
        (
            "- {subject: Hi, body: x}\n- {after: 1d, body: x, new_thread: 1}",
            "steps[2].new_thread",
            "true or false",
        ),
        (
            "- {subject: Hi, body: x}\n- {after: 1d, body: x, html_file: 7}",
            "steps[2].html_file",
            "expected text",
        ),
        # the body
        ("- {subject: Hi}", "steps[1].body", "give the step a body"),
        ("- {subject: Hi, body: x, body_file: a.txt}", "steps[1].body_file", "not both"),
        ("- {subject: Hi, body: '  '}", "steps[1].body", "empty"),
        # the sequence
        ("- {body: x}", "steps[1].subject", "step 1 needs a subject"),
        ("- {subject: Hi, body: x, after: 1d}", "steps[1].after", "no delay"),
        ("- {subject: Hi, body: x}\n- {body: y}", "steps[2].after", "wait after the previous"),
        ("- {subject: Hi, body: x}\n- {after: 0d, body: y}", "steps[2].after", "at least 1"),
        ("- {subject: Hi, body: x}\n- {after: 61d, body: y}", "steps[2].after", "at most 60"),
        (
            "- {subject: Hi, body: x}\n- {after: 1d, body: y, subject: ''}",
            "steps[2].subject",
            "empty",
        ),
        ("- {subject: Hi, body: x}\n" + "- {after: 1d, body: y}\n" * 10, "steps", "1 to 10 steps"),
        # the templates, as campaign create checks them
        ("- {subject: 'Hi {{ name', body: x}", "steps[1].subject", "template syntax error"),
        ("- {subject: Hi, body: x}\n- {after: 1d, body: '{% if %}'}", "steps[2].body", "syntax"),
        ("- {subject: Hi, body: '{{ sender.name|upper }}'}", "steps[1].body", "sender.name"),
    ],
)
def test_every_problem_names_its_step_and_key(
    tmp_path: Path, text: str, field: str, reason: str
) -> None:
    error = refused(write(tmp_path, "steps.yaml", text))
    assert error.field == field
    assert reason in error.reason


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ('[{"subject": "Hi", "body": "x", "body": "y"}]', "steps_file", "twice"),
        ('[{"subject": "Hi", "body": "x"},]', "steps_file", "not valid JSON"),
        ('{"steps": [{"subject": "Hi", "body": "x"}], "x": 1}', "x", "unknown key"),
        ('[{"subject": "Hi", "body": "x", "new_thread": "true"}]', "steps[1].new_thread", "true"),
        ("[" * 100_000 + "]" * 100_000, "steps_file", "nested too deeply"),
    ],
)
def test_json_problems(tmp_path: Path, text: str, field: str, reason: str) -> None:
    error = refused(write(tmp_path, "steps.json", text))
    assert error.field == field
    assert reason in error.reason


def test_files_that_cannot_be_read_name_their_key(tmp_path: Path) -> None:
    first = "- {subject: Hi, body: x}\n"
    (tmp_path / "folder").mkdir()
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    cases = {
        "- {subject: Hi, body_file: missing.txt}": ("steps[1].body_file", "cannot be read"),
        first + "- {after: 1d, body_file: folder}": ("steps[2].body_file", "cannot be read"),
        first + "- {after: 1d, body_file: latin1.txt}": ("steps[2].body_file", "not UTF-8"),
        first + "- {after: 1d, body: y, html_file: nope.html}": ("steps[2].html_file", "read"),
    }
    for text, (field, reason) in cases.items():
        error = refused(write(tmp_path, "steps.yaml", text))
        assert (error.field, reason in error.reason) == (field, True), text
    error = refused(tmp_path / "absent.yaml")
    assert (error.field, "cannot be read" in error.reason) == ("steps_file", True)


def test_file_templates_are_checked_and_named_by_their_key(tmp_path: Path) -> None:
    write(tmp_path, "bad.txt", "Hello {{ name\n")
    write(tmp_path, "bad.html", "<p>{% for %}</p>\n")
    write(tmp_path, "blank.html", "\n")
    first = "- {subject: Hi, body: x}\n"
    cases = {
        first + "- {after: 1d, body_file: bad.txt}": "steps[2].body_file",
        first + "- {after: 1d, body: y, html_file: bad.html}": "steps[2].html_file",
        first + "- {after: 1d, body: y, html_file: blank.html}": "steps[2].html_file",
    }
    for text, field in cases.items():
        assert refused(write(tmp_path, "steps.yaml", text)).field == field, text


def test_sizes_are_bounded(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("- {subject: Hi, body: x}\n" + "#" * MAX_STEPS_FILE_BYTES)
    assert refused(big).field == "steps_file"
    limits = TemplateLimits(max_source_bytes=100, max_html_source_bytes=50)
    write(tmp_path, "long.txt", "x" * 101)
    write(tmp_path, "long.html", "<p>" + "x" * 60 + "</p>")
    write(tmp_path, "ok.txt", "x" * 99)
    first = "- {subject: Hi, body: x}\n"
    cases = {
        first + "- {after: 1d, body_file: long.txt}": "steps[2].body_file",
        first + "- {after: 1d, body: y, html_file: long.html}": "steps[2].html_file",
        # subject and body together pass the source bound (compile_templates' own check)
        "- {subject: Hello, body_file: ok.txt}": "steps[1].body_file",
    }
    for text, field in cases.items():
        error = refused(write(tmp_path, "steps.yaml", text), limits=limits)
        assert error.field == field, text
    assert read_steps_file(write(tmp_path, "ok.yaml", "- {subject: H, body_file: ok.txt}"), limits)


def test_a_yaml_alias_bomb_is_refused_without_printing_it(tmp_path: Path) -> None:
    # nine levels of ten references: a billion strings if it were ever expanded or printed
    levels = ["&a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    text = f"- subject: Hi\n  body: [{', '.join(levels)}]\n"
    error = refused(write(tmp_path, "bomb.yaml", text))
    assert (error.field, error.value) == ("steps[1].body", "<list>")
    assert len(str(error)) < 200


FIRST = Step(1, "Hello {{ name }}", "Dear {{ name }}", None, None)

LATER_ONLY = """\
- after: 2d
  body: "Hi {{ name }}, again."
- after: 30m
  subject: Bye
  body: "Bye {{ name }}."
  new_thread: true
"""


def test_with_step_1_given_apart_the_file_holds_steps_2_on(tmp_path: Path) -> None:
    steps = read_steps_file(write(tmp_path, "later.yaml", LATER_ONLY), first=FIRST)
    assert steps == [
        FIRST,
        Step(2, None, "Hi {{ name }}, again.", None, Delay(2, DelayUnit.DAYS)),
        Step(3, "Bye", "Bye {{ name }}.", None, Delay(30, DelayUnit.MINUTES), True),
    ]


def test_with_step_1_given_apart_errors_name_the_real_step_number(tmp_path: Path) -> None:
    text = LATER_ONLY.replace("after: 30m", "after: 30x")
    with pytest.raises(InvalidField) as exc:
        read_steps_file(write(tmp_path, "later.yaml", text), first=FIRST)
    assert exc.value.field == "steps[3].after"
    text = LATER_ONLY.replace('body: "Bye {{ name }}."', 'body: "Bye {{ name"')
    with pytest.raises(InvalidField) as exc:
        read_steps_file(write(tmp_path, "later.yaml", text), first=FIRST)
    assert exc.value.field == "steps[3].body"


def test_step_1_in_the_file_and_given_apart_is_refused_naming_steps(bodies: Path) -> None:
    with pytest.raises(InvalidField) as exc:
        read_steps_file(write(bodies, "steps.yaml", YAML_EXAMPLE), first=FIRST)
    assert exc.value.field == "steps"
    assert "given apart" in exc.value.reason


def test_with_step_1_given_apart_a_later_step_without_after_is_named(tmp_path: Path) -> None:
    text = LATER_ONLY + '- body: "third"\n'
    with pytest.raises(InvalidField) as exc:
        read_steps_file(write(tmp_path, "later.yaml", text), first=FIRST)
    assert exc.value.field == "steps[4].after"


def test_too_many_steps_are_refused_before_any_entry_is_read(tmp_path: Path) -> None:
    # Each entry is compiled (and its files read) when built: a list of many thousand
    # aliases of one entry must be refused by its length first, not after reading them all.
    text = "- &s {subject: Hi, body_file: missing.txt}\n" + "- *s\n" * 11
    error = refused(write(tmp_path, "many.yaml", text))
    assert (error.field, error.value) == ("steps", 12)
    later = "- {after: 1d, body_file: missing.txt}\n" * 10
    with pytest.raises(InvalidField) as exc:
        read_steps_file(write(tmp_path, "later.yaml", later), first=FIRST)
    assert (exc.value.field, exc.value.value) == ("steps", 11)


def test_too_many_inline_steps_are_refused_before_any_is_compiled() -> None:
    entries = [{"subject": "Hi", "body": "{{ broken"}] * 11
    with pytest.raises(InvalidField) as exc:
        steps_from_entries(entries)
    assert (exc.value.field, exc.value.value) == ("steps", 11)
