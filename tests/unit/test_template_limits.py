"""Template bounds (issue 17, Medium 2 and Low 1): source size, nesting, output, range, time.

Each attack from the red-team pass is refused naming its part (a compile problem) or its row
and part (a render problem), quickly and without allocating the value it asked for.
"""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import pytest

from sendqueue.domain.errors import InvalidField, InvalidInput
from sendqueue.services.importing.recipients import (
    ImportLimits,
    TemplateLimits,
    Templates,
    parse_recipients,
)
from sendqueue.services.importing.rows import parse_recipient_rows
from sendqueue.services.templates import sandbox as template_sandbox
from sendqueue.services.templates.render import compile_templates

ROWS = [{"email": "ada@example.com", "name": "Ada", "x": "ab"}]

NESTED = {
    "for x25": "{% for a in x %}" * 25 + "{% endfor %}" * 25,
    "if x120": "{% if x %}" * 120 + "{% endif %}" * 120,
    "paren x200": "{{ " + "(" * 200 + "x" + ")" * 200 + " }}",
    "string x5000": "{{ x" + "|string" * 5000 + " }}",
}


def row_problem(templates: Templates, limits: ImportLimits | None = None) -> tuple[str, int, str]:
    with pytest.raises(InvalidInput) as caught:
        parse_recipient_rows(ROWS, templates=templates, limits=limits or ImportLimits())
    (problem,) = caught.value.errors
    assert problem.row is not None
    return problem.field, problem.row, problem.reason


@pytest.mark.parametrize("part", ["subject", "body", "html"])
@pytest.mark.parametrize("source", NESTED.values(), ids=NESTED.keys())
def test_a_too_deeply_nested_template_is_refused_naming_its_part(part: str, source: str) -> None:
    templates = Templates(**{"subject": "s", part: source})

    with pytest.raises(InvalidField) as caught:
        compile_templates(templates)

    assert caught.value.field == part
    assert "nested" in caught.value.reason or "syntax" in caught.value.reason


def test_the_subject_template_is_capped_before_compiling() -> None:
    source = "{{x}}" * 300_000  # the red team's 1.5 MB subject
    started = time.monotonic()

    with pytest.raises(InvalidField) as caught:
        parse_recipient_rows(ROWS, templates=Templates(subject=source, body="b"))

    assert caught.value.field == "subject"
    assert "larger than 65536 bytes" in caught.value.reason
    assert time.monotonic() - started < 1


def test_subject_and_body_share_one_cap_and_html_has_its_own() -> None:
    limits = TemplateLimits(max_source_bytes=100, max_html_source_bytes=200)
    compile_templates(Templates(subject="s" * 50, body="b" * 50, html="h" * 200), limits)

    with pytest.raises(InvalidField) as body:
        compile_templates(Templates(subject="s" * 50, body="b" * 51), limits)
    with pytest.raises(InvalidField) as html:
        compile_templates(Templates(subject="s", html="h" * 201), limits)

    assert body.value.field == "body"
    assert html.value.field == "html"
    assert "larger than 200 bytes" in html.value.reason


def test_the_number_of_tags_is_capped_per_template() -> None:
    limits = TemplateLimits(max_tags=4)
    compile_templates(Templates(subject="{{ a }}{% if b %}{{ c }}{% endif %}"), limits)

    with pytest.raises(InvalidField) as caught:
        compile_templates(Templates(subject="s", html="{{ a }}" * 5), limits)

    assert caught.value.field == "html"
    assert "more than 4 {{ }} or {% %} tags" in caught.value.reason


def test_range_is_capped() -> None:
    field, row, reason = row_problem(Templates("s", "{{ range(10001)|length }}"))

    assert (field, row) == ("body", 2)
    assert "range() of more than 10000 numbers" in reason
    (ok,) = parse_recipient_rows(
        ROWS, templates=Templates("s", "{{ range(10000)|length }}")
    ).recipients
    assert ok.text == "10000"


@pytest.mark.parametrize(
    "source",
    [
        "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}",
        "{% for i in range(10000) %}{% for j in x * 5000 %}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{% if n %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(40) }}",
    ],
    ids=["nested-range", "nested-string", "macro-tree"],
)
def test_a_row_has_a_time_budget(source: str) -> None:
    started = time.monotonic()

    field, row, reason = row_problem(Templates("s", html=source))

    assert time.monotonic() - started < 2
    assert (field, row) == ("html", 2)
    assert "took longer than 0.1 s for one row" in reason


@pytest.mark.parametrize(
    ("source", "what"),
    [
        ("{{ 'x'*200000000 }}", "(*)"),
        ("{{ ([x*1000]*100000)|join }}", "(*)"),
        ("{% set s = x %}" + "{% set s = s + s %}" * 40 + "{{ s|length }}", "(+)"),
        ("{% set s = x %}" + "{% set s = s ~ s %}" * 40 + "{{ s|length }}", "(~)"),
        ("{% for i in range(10000) %}{{ x * 90 }}{% endfor %}", "output longer"),
    ],
)
def test_values_and_output_past_the_cap_are_refused_without_building_them(
    source: str, what: str
) -> None:
    tracemalloc.start()
    try:
        field, row, reason = row_problem(Templates("s", source))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert (field, row) == ("body", 2)
    assert what in reason and "100000 characters" in reason
    assert peak < 20 * 1024 * 1024, peak


@pytest.mark.parametrize(
    ("source", "what"),
    [
        ("{{ 2**100000000 }}", "(**)"),
        ("{% set a = 7**5000 %}{% set b = a*a %}{% set c = b*b %}{{ c*c > 1 }}", "(*)"),
        ("{% set a = 7**5000 %}{{ (a*a*a) // 7 > 1 }}", "(*)"),
        ("{% set a = 2**16383 %}{{ a + a > 1 }}", "(+)"),
        ("{% set a = 2**16383 %}{{ -a - a > 1 }}", "(-)"),
        ("{{ 1|round(10**6, 'floor') }}", "round()"),
        ("{{ 1|round(-10**6) }}", "round()"),
        ("{{ ('f' * 5000)|int(base=16) > 1 }}", "a filter"),
        ("{{ (1).from_bytes((x * 3000).encode(), 'big') > 1 }}", "from_bytes"),
    ],
)
def test_integers_longer_than_the_bound_are_refused_before_they_are_computed(
    source: str, what: str
) -> None:
    tracemalloc.start()
    try:
        field, row, reason = row_problem(Templates("s", source))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert (field, row) == ("body", 2)
    assert what in reason and "longer than 16384 bits" in reason, reason
    assert peak < 20 * 1024 * 1024, peak


@pytest.mark.parametrize(
    "literal", ["1" + "0" * 5000, "0x" + "f" * 5000], ids=["decimal", "hexadecimal"]
)
def test_a_huge_number_written_in_the_template_is_refused_naming_its_part(literal: str) -> None:
    with pytest.raises(InvalidField) as caught:
        compile_templates(Templates("s", html=f"{{{{ {literal} // 3 }}}}"))

    assert caught.value.field == "html"
    assert "16384 bits" in caught.value.reason or "4300 digits" in caught.value.reason


NINE = range(9)  # nine values of 50,000 characters: each under the cap, together past 4 caps


@pytest.mark.parametrize(
    "source",
    [
        "".join(f"{{% set l{i} = [s ~ '{i}'] %}}" for i in NINE),
        "".join(f"{{% set l{i} = [s[{i}:]] %}}" for i in NINE),
        "".join(f"{{% set d{i} = {{{i}: s[{i}:]}} %}}" for i in NINE),
        "".join(f"{{% set t{i} = (s[{i}:], 1) %}}" for i in NINE),
        "".join(f"{{% set l{i} = (x * 8000)|list %}}" for i in NINE),
        "".join(f"{{% set v{i} = s ~ '{i}' %}}" for i in NINE),
    ],
    ids=["concat-items", "list-literal", "dict-literal", "tuple-literal", "list-filter", "concat"],
)
def test_joined_values_and_containers_count_toward_the_rows_text(source: str) -> None:
    field, row, reason = row_problem(Templates("s", "{% set s = x * 25000 %}" + source + "ok"))

    assert (field, row) == ("body", 2)
    assert "made more than 400000 characters of text in all" in reason


def test_html_output_has_its_larger_cap_and_limits_are_settable() -> None:
    source = "{% for i in range(5000) %}{{ x * 50 }}{% endfor %}"  # 500,000 characters
    (recipient,) = parse_recipient_rows(ROWS, templates=Templates("s", html=source)).recipients
    assert recipient.html is not None and len(recipient.html) == 500_000

    small = ImportLimits(templates=TemplateLimits(max_html_output_chars=1000))
    field, _, reason = row_problem(Templates("s", html=source), small)
    assert (field, reason) == ("html", "template failed: output longer than 1000 characters")


def test_templates_are_compiled_once_per_import_not_per_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compiled: list[str] = []
    original = template_sandbox.BoundedSandbox._parse

    def counting(self: Any, source: str, *args: Any, **kwargs: Any) -> Any:
        compiled.append(source)
        return original(self, source, *args, **kwargs)

    monkeypatch.setattr(template_sandbox.BoundedSandbox, "_parse", counting)
    data = "email,x\n" + "".join(f"u{i}@example.com,{i}\n" for i in range(200))

    result = parse_recipients(data.encode(), templates=Templates("Hi {{ x }}", "B", "<p>H</p>"))

    assert len(result.recipients) == 200
    assert sorted(compiled) == ["<p>H</p>", "B", "Hi {{ x }}"]


def test_ordinary_templates_still_render_and_a_compiled_one_renders_outside_a_row() -> None:
    source = "{% for i in range(3) %}{{ loop.index }}{{ x }}{% endfor %} {{ x ~ '!' }}"
    (recipient,) = parse_recipient_rows(ROWS, templates=Templates("s", source)).recipients
    assert recipient.text == "1ab2ab3ab ab!"

    compiled = compile_templates(Templates(subject="Hi {{ name * 2 }}"))
    assert compiled.subject is not None
    time.sleep(0.15)  # past a row's budget: none applies outside a row
    assert compiled.subject.render(name="Ada") == "Hi AdaAda"


def test_a_pause_of_the_process_does_not_fail_an_ordinary_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The clock jumps past every row's budget (a long garbage collection, a busy machine):
    ordinary rows take far fewer steps than a runaway and still render."""
    real = time.monotonic
    offset = [0.0]

    def jumpy() -> float:
        offset[0] += 1.0
        return real() + offset[0]

    monkeypatch.setattr(time, "monotonic", jumpy)
    source = "Dear {{ name }},{% for i in range(20) %} {{ i }}{% endfor %}"

    result = parse_recipient_rows(ROWS, templates=Templates("Hi {{ name }}", source))

    assert result.recipients[0].text.startswith("Dear Ada, 0 1")


ORDINARY = [
    "{{ '%05d|%-6s|%.2f|%(a)s' % (7, x, 3.14159, {'a': 1}) if false else '%05d %%' % 7 }}",
    "{{ '%s and %s' % (name, x) }} {{ '%(n)s' % {'n': name} }} {{ '%*d' % (4, 2) }}",
    "{{ '{:>10}|{:^7}|{:.3f}|{n}'.format(name, x, 2.5, n=1) }}",
    "{{ '{0:{1}}'.format(name, 8) }} {{ '{a}-{b}'.format_map({'a': 1, 'b': 2}) }}",
    "{{ name|center(11) }}|{{ name.ljust(6) }}|{{ name.rjust(6) }}|{{ '42'.zfill(5) }}",
    "{{ 'a\tb'.expandtabs(4) }} {{ name.replace('a', 'xy') }} {{ ', '.join([name, x]) }}",
    "{{ 'line one\nline two'|indent(2, true) }} {{ (name ~ ' ')|wordwrap(3) }}",
    "{{ [name, x]|join(', ') }} {{ range(5)|map('string')|join }} {{ [1, 2, 3]|batch(2)|list }}",
    "{{ {'a': [1, {'b': name}]}|tojson }} {{ {'a': [1, 2]}|tojson(2) }} {{ [1, 'x']|pprint }}",
    "{{ '%s'|format(name) }} {{ name|truncate(3, true, '') }} {{ lipsum(2)|wordcount > 3 }}",
    "{% set l = [] %}{% for i in range(3) %}{% set _ = l.append(i) %}{% endfor %}{{ l }}",
    "{% macro m(n) %}<{{ n }}>{% endmacro %}{% set b %}{{ m(1) }}{{ m(2) }}{% endset %}{{ b }}",
    "{{ name.translate({65: 'a'}) }} {{ ('<b>{}</b>'|safe).format(x) }} {{ name|upper|e }}",
    "{{ 2**10 }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 10 - 3 }} {{ 7 / 2 }} {{ 2**-1 }} {{ 1**(10**9) }}",
    "{{ 3.14159|round(2) }} {{ 1234|round(-2) }} {{ '10'|int + 1 }} {{ 'ff'|int(base=16) }}",
    "{{ [1, 2, 3]|sum * 10**20 }} {{ (1).to_bytes(2, 'big') }} {{ 2.5 * 4 }} {{ -(2**64) }}",
    "{{ x ~ 1 ~ [1, 'a'] ~ none }} {{ ('<b>'|safe) ~ '<i>' ~ x }} {{ '<i>' ~ x }}",
    "{% autoescape false %}{{ '<a>' ~ ('<b>'|safe) }}{% endautoescape %}{{ (1, 2) }}",
    "{% set a, b = 1, 2 %}{{ a ~ b }}{% for k, v in {'a': [1], 'b': (2,)}|dictsort %}{{ k }}"
    "{{ v }}{% endfor %}{{ [3, 1, 2]|sort|list }}{{ range(3)|batch(2)|list }}{{ x|list }}",
]


@pytest.mark.parametrize("part", ["body", "html"])
@pytest.mark.parametrize("source", ORDINARY, ids=[f"ordinary{i}" for i in range(len(ORDINARY))])
def test_ordinary_widths_formats_and_filters_render_as_jinja_renders_them(
    part: str, source: str
) -> None:
    from jinja2 import StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment

    plain = SandboxedEnvironment(
        undefined=StrictUndefined, autoescape=part == "html", keep_trailing_newline=True
    )
    expected = plain.from_string(source).render(ROWS[0])
    (recipient,) = parse_recipient_rows(
        ROWS, templates=Templates(**{"subject": "s", part: source})
    ).recipients

    assert (recipient.text if part == "body" else recipient.html) == expected
