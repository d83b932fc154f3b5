"""Importing recipients from CSV: parsing, mail-merge templates and row validation."""

from __future__ import annotations

import csv
import io
import pathlib
import random

import pytest
from email_validator import EmailNotValidError, validate_email
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sendqueue.domain.errors import InvalidField, InvalidInput
from sendqueue.services.importing.recipients import (
    ImportLimits,
    Templates,
    compile_templates,
    parse_recipients,
)

HEADER = "email,name,subject,body"


def csv_bytes(*lines: str, bom: bool = False, eol: str = "\r\n") -> bytes:
    data = "".join(line + eol for line in lines).encode("utf-8")
    return (b"\xef\xbb\xbf" + data) if bom else data


def invalid(source: bytes, **kwargs: object) -> InvalidInput:
    with pytest.raises(InvalidInput) as caught:
        parse_recipients(source, **kwargs)  # type: ignore[arg-type]
    return caught.value


def refused(source: object, **kwargs: object) -> InvalidField:
    with pytest.raises(InvalidField) as caught:
        parse_recipients(source, **kwargs)  # type: ignore[arg-type]
    return caught.value


# --- happy paths ------------------------------------------------------------------------------


@pytest.mark.parametrize("bom", [False, True], ids=["plain", "bom"])
def test_happy_path_reads_rows_in_order_and_normalizes_addresses(bom: bool) -> None:
    data = csv_bytes(
        HEADER,
        "ada@example.com,Ada Lovelace,Hello Ada,Dear Ada",
        "Bob.Smith@EXAMPLE.ORG,Bob,Hello Bob,Dear Bob",
        bom=bom,
    )

    result = parse_recipients(data)

    assert result.rows == 2
    assert result.duplicates == 0
    assert result.duplicate_rows == []
    first, second = result.recipients
    assert (first.position, first.email, first.name) == (0, "ada@example.com", "Ada Lovelace")
    assert (first.subject, first.text, first.html) == ("Hello Ada", "Dear Ada", None)
    # The domain is normalized to lower case; the local part is kept as written.
    assert (second.position, second.email) == (1, "Bob.Smith@example.org")
    assert first.variables == {}


def test_header_names_are_trimmed_and_matched_without_case() -> None:
    data = csv_bytes(" EMAIL , Name ,Subject,BODY", "ada@example.com,Ada,Hi,Text")

    (recipient,) = parse_recipients(data).recipients

    assert (recipient.email, recipient.name, recipient.subject, recipient.text) == (
        "ada@example.com",
        "Ada",
        "Hi",
        "Text",
    )


def test_only_the_address_is_trimmed_other_cells_are_kept_as_written() -> None:
    data = csv_bytes(HEADER + ",city", "  ada@example.com , Ada ,  Hi  ,  Body  , Paris ")

    (recipient,) = parse_recipients(data).recipients

    assert recipient.email == "ada@example.com"
    assert (recipient.name, recipient.subject, recipient.text) == (" Ada ", "  Hi  ", "  Body  ")
    assert recipient.variables == {"city": " Paris "}


def test_sources_as_bytes_path_string_pathlike_and_stream_agree(tmp_path: pathlib.Path) -> None:
    data = csv_bytes(HEADER, "ada@example.com,Ada,Hi,Text")
    path = tmp_path / "people.csv"
    path.write_bytes(data)
    stream = io.BytesIO(data)

    results = [
        parse_recipients(data),
        parse_recipients(str(path)),
        parse_recipients(path),
        parse_recipients(stream),
    ]

    assert all(result == results[0] for result in results)
    assert not stream.closed  # the caller's stream is the caller's to close


def test_missing_path_is_reported_as_unreadable(tmp_path: pathlib.Path) -> None:
    error = refused(tmp_path / "nope.csv")

    assert error.field == "file"
    assert "cannot be read" in error.reason


def test_quoted_cells_keep_commas_quotes_and_embedded_newlines() -> None:
    body = 'Line one, with a comma\r\nLine "two"\nLine three'
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["email", "name", "subject", "body"])
    writer.writerow(["ada@example.com", "Lovelace, Ada", "Hi, Ada", body])
    writer.writerow(["bob@example.com", "Bob", "Hi", "x"])
    writer.writerow(["not-an-address", "Eve", "Hi", "x"])

    with pytest.raises(InvalidInput) as caught:
        parse_recipients(out.getvalue().encode())
    # The record with embedded newlines spans three lines, yet counts as one row.
    assert [(e.field, e.row) for e in caught.value.errors] == [("email", 4)]

    fixed = out.getvalue().replace("not-an-address", "eve@example.com").encode()
    ada, _bob, _eve = parse_recipients(fixed).recipients
    assert (ada.name, ada.subject, ada.text) == ("Lovelace, Ada", "Hi, Ada", body)


def test_blank_lines_are_skipped_but_keep_their_row_numbers() -> None:
    data = csv_bytes(
        "",
        HEADER,
        "ada@example.com,Ada,Hi,Text",
        "",
        ",,,",
        "   ",
        "bad-address,Bob,Hi,Text",
        "",
    )

    error = invalid(data)

    assert error.summary == "1 of 2 rows are invalid"
    # Row numbers are spreadsheet rows: blank records count, as they show in a spreadsheet.
    assert [(e.field, e.row) for e in error.errors] == [("email", 7)]


def test_lf_only_line_endings_are_read_the_same() -> None:
    data = csv_bytes(HEADER, "ada@example.com,Ada,Hi,Text", "bob@example.com,Bob,Hi,x", eol="\n")

    assert [r.email for r in parse_recipients(data).recipients] == [
        "ada@example.com",
        "bob@example.com",
    ]


# --- mail-merge -------------------------------------------------------------------------------


def test_extra_columns_are_variables_and_reachable_through_row() -> None:
    data = csv_bytes("email,name,city,My Col", "ada@example.com,Ada,Paris,first")
    templates = Templates(
        subject="Hi {{ name }} from {{ city }}",
        body='{{ email }} / {{ row["My Col"] }} / {{ row.city }} / {{ row.name }}',
    )

    (recipient,) = parse_recipients(data, templates=templates).recipients

    assert recipient.subject == "Hi Ada from Paris"
    assert recipient.text == "ada@example.com / first / Paris / Ada"
    assert recipient.variables == {"city": "Paris", "My Col": "first"}


def test_template_sees_the_normalized_address() -> None:
    data = csv_bytes("email", "Ada@EXAMPLE.com")

    (recipient,) = parse_recipients(data, templates=Templates("x", "{{ email }}")).recipients

    assert recipient.text == "Ada@example.com"


def test_html_template_escapes_variables_and_text_body_does_not() -> None:
    data = csv_bytes("email,snippet", "ada@example.com,<script>alert(1)</script>")
    templates = Templates(
        subject="Hi {{ snippet }}", body="Text: {{ snippet }}", html="<p>{{ snippet }}</p>"
    )

    (recipient,) = parse_recipients(data, templates=templates).recipients

    assert recipient.html == "<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>"
    assert recipient.text == "Text: <script>alert(1)</script>"
    assert recipient.subject == "Hi <script>alert(1)</script>"


def test_body_template_keeps_its_trailing_newline_and_subject_drops_it() -> None:
    data = csv_bytes("email,name", "ada@example.com,Ada")
    templates = Templates(subject="Hi {{ name }}\n", body="Dear {{ name }},\n\nBye\n")

    (recipient,) = parse_recipients(data, templates=templates).recipients

    assert recipient.subject == "Hi Ada"
    assert recipient.text == "Dear Ada,\n\nBye\n"


def test_a_rows_own_cell_wins_over_the_template_and_an_empty_cell_falls_back() -> None:
    data = csv_bytes(
        "email,name,subject,body,html",
        "ada@example.com,Ada,Own subject,Own body,<b>own</b>",
        "bob@example.com,Bob,,,",
    )
    templates = Templates(
        subject="Template for {{ name }}", body="Body for {{ name }}", html="<i>{{ name }}</i>"
    )

    ada, bob = parse_recipients(data, templates=templates).recipients

    assert (ada.subject, ada.text, ada.html) == ("Own subject", "Own body", "<b>own</b>")
    assert (bob.subject, bob.text, bob.html) == ("Template for Bob", "Body for Bob", "<i>Bob</i>")


def test_cells_are_literal_text_not_templates() -> None:
    data = csv_bytes(HEADER, "ada@example.com,Ada,{{ name }},{% if x %}")

    (recipient,) = parse_recipients(data).recipients

    assert (recipient.subject, recipient.text) == ("{{ name }}", "{% if x %}")


def test_undefined_variable_is_that_rows_error_naming_row_and_field() -> None:
    data = csv_bytes(
        "email,name,subject",
        "ada@example.com,Ada,Own subject",
        "bob@example.com,Bob,",
        "eve@example.com,Eve,Own subject",
    )
    templates = Templates(subject="Hi {{ first_name }}", body="Hello")

    error = invalid(data, templates=templates)

    (problem,) = error.errors
    assert (problem.field, problem.row) == ("subject", 3)
    assert "'first_name' is undefined" in problem.reason
    assert problem.value == "Hi {{ first_name }}"
    assert error.total == 1
    assert error.summary == "1 of 3 rows are invalid"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ 1 / 0 }}", "ZeroDivisionError"),
        ("{{ ''.__class__.__mro__ }}", "__class__"),
    ],
    ids=["runtime-error", "sandbox"],
)
def test_any_failure_while_rendering_is_a_row_error(source: str, expected: str) -> None:
    data = csv_bytes("email,subject", "ada@example.com,Hi")

    error = invalid(data, templates=Templates(body=source))

    (problem,) = error.errors
    assert (problem.field, problem.row) == ("body", 2)
    assert expected in problem.reason


@pytest.mark.parametrize("part", ["subject", "body", "html"])
def test_template_syntax_error_names_its_part_before_any_row_is_read(part: str) -> None:
    templates = Templates(**{part: "Hello {{ name }"})
    stream = io.BytesIO(csv_bytes(HEADER, "ada@example.com,Ada,Hi,Body"))

    with pytest.raises(InvalidField) as caught:
        parse_recipients(stream, templates=templates)

    assert caught.value.field == part
    assert "syntax error on line 1" in caught.value.reason
    assert stream.tell() == 0
    with pytest.raises(InvalidField) as direct:
        compile_templates(templates)
    assert direct.value.field == part


def test_compile_templates_returns_usable_templates() -> None:
    compiled = compile_templates(Templates(subject="Hi {{ name }}", html="<p>{{ x }}</p>"))

    assert compiled.subject is not None
    assert compiled.subject.render(name="Ada") == "Hi Ada"
    assert compiled.body is None
    assert compiled.html is not None
    assert compiled.html.render(x="<b>") == "<p>&lt;b&gt;</p>"


def test_no_subject_anywhere_is_one_error_not_one_per_row() -> None:
    data = csv_bytes("email,body", *[f"u{i}@example.com,x" for i in range(5)])

    error = refused(data)

    assert error.field == "subject"
    assert "--subject" in error.reason


def test_no_body_anywhere_is_one_error_not_one_per_row() -> None:
    data = csv_bytes("email,subject", "ada@example.com,Hi")

    error = refused(data)

    assert error.field == "body"


def test_empty_subject_cell_without_template_is_a_row_error() -> None:
    data = csv_bytes(HEADER, "ada@example.com,Ada,Hi,x", "bob@example.com,Bob,  ,x")

    (problem,) = invalid(data).errors

    assert (problem.field, problem.row) == ("subject", 3)
    assert problem.reason.startswith("empty")


def test_body_may_be_empty_only_when_there_is_html() -> None:
    good = csv_bytes("email,subject,body,html", "ada@example.com,Hi,,<p>Hi</p>")
    bad = csv_bytes("email,subject,body,html", "ada@example.com,Hi,,")

    (recipient,) = parse_recipients(good).recipients
    (problem,) = invalid(bad).errors

    assert (recipient.text, recipient.html) == ("", "<p>Hi</p>")
    assert (problem.field, problem.row) == ("body", 2)


# --- row validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "address", ["not-an-address", "ada@", "@example.com", "ada@@example.com", "ada@localhost"]
)
def test_invalid_address_is_a_row_error(address: str) -> None:
    data = csv_bytes(HEADER, "ada@example.com,Ada,Hi,x", f"{address},Bob,Hi,x")

    (problem,) = invalid(data).errors

    assert (problem.field, problem.row, problem.value) == ("email", 3, address)
    assert problem.reason.startswith("not a valid address")


def test_empty_address_is_a_row_error() -> None:
    (problem,) = invalid(csv_bytes(HEADER, " ,Bob,Hi,x")).errors

    assert (problem.field, problem.row) == ("email", 2)
    assert problem.reason.startswith("empty")


@pytest.mark.parametrize("column", ["email", "name", "subject"])
@pytest.mark.parametrize("breaker", ["\r\n", "\n", "\r"], ids=["crlf", "lf", "cr"])
def test_line_breaks_in_header_fields_are_refused(column: str, breaker: str) -> None:
    cells = {"email": "ada@example.com", "name": "Ada", "subject": "Hi", "body": "x"}
    cells[column] = cells[column][:2] + breaker + "Bcc: eve@example.com"
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(cells.keys())
    writer.writerow(cells.values())
    writer.writerow(["bob@example.com", "Bob", "Hi", "x"])
    writer.writerow(["not-an-address", "Eve", "Hi", "x"])

    error = invalid(out.getvalue().encode())

    first, second = error.errors
    assert (first.field, first.row) == (column, 2)
    assert "line break" in first.reason
    # The bad record spans two lines of the file but is one row; the next ones keep their number.
    assert (second.field, second.row) == ("email", 4)


def test_a_header_line_break_from_a_template_is_refused() -> None:
    data = csv_bytes("email,extra", 'ada@example.com,"one\ntwo"')

    (problem,) = invalid(data, templates=Templates(subject="{{ extra }}", body="x")).errors

    assert (problem.field, problem.row) == ("subject", 2)
    assert "line break" in problem.reason


@pytest.mark.parametrize(
    ("char", "words"),
    [("\u2028", "line separator U+2028"), ("\x85", "line separator U+0085"), ("\x00", "U+0000")],
)
def test_other_line_separators_and_control_characters_are_refused(char: str, words: str) -> None:
    data = csv_bytes(HEADER, f"ada@example.com,A{char}da,Hi,x")

    (problem,) = invalid(data).errors

    assert problem.field == "name"
    assert words in problem.reason


def test_tabs_in_names_and_control_characters_in_bodies_are_fine() -> None:
    data = csv_bytes(HEADER, 'ada@example.com,Ada\tL,Hi\tthere,"a\x0cb\r\nc"')

    (recipient,) = parse_recipients(data).recipients

    assert (recipient.name, recipient.subject, recipient.text) == (
        "Ada\tL",
        "Hi\tthere",
        "a\x0cb\r\nc",
    )


def test_length_limits_per_field() -> None:
    limits = ImportLimits(max_name_chars=5, max_subject_chars=6, max_field_chars=7)
    data = csv_bytes(
        "email,name,subject,body,html,city",
        "a@example.com,Ada,Hi,body,,Paris",
        "b@example.com,Bobbie,Hi,body,,Paris",
        "c@example.com,Cy,Subject,body,,Paris",
        "d@example.com,Di,Hi,longbody,,Paris",
        "e@example.com,Ed,Hi,,<b>long</b>,Paris",
        "f@example.com,Flo,Hi,body,,Paris Texas",
    )

    error = invalid(data, limits=limits)

    assert [(e.row, e.field) for e in error.errors] == [
        (3, "name"),
        (4, "subject"),
        (5, "body"),
        (6, "html"),
        (7, "city"),
    ]
    assert all("longer than" in e.reason for e in error.errors)


def test_rendered_parts_are_held_to_the_length_limits_too() -> None:
    limits = ImportLimits(max_subject_chars=10)
    data = csv_bytes("email,name", "ada@example.com,Ada", "bob@example.com,Bartholomew")

    (problem,) = invalid(data, limits=limits, templates=Templates("Hi {{ name }}", "x")).errors

    assert (problem.field, problem.row) == ("subject", 3)


def test_huge_values_are_clipped_in_the_error() -> None:
    limits = ImportLimits(max_field_chars=1000)
    data = csv_bytes(HEADER, "ada@example.com,Ada,Hi," + "x" * 5000)

    (problem,) = invalid(data, limits=limits).errors

    assert isinstance(problem.value, str)
    assert len(problem.value) < 300
    assert problem.value.endswith("(5000 characters)")


def test_one_row_may_have_several_problems_each_reported() -> None:
    data = csv_bytes(HEADER, "ada@example.com,Ada,Hi,x", 'nope,"Bo\rb",,x')

    error = invalid(data)

    assert [(e.row, e.field) for e in error.errors] == [(3, "email"), (3, "name"), (3, "subject")]
    assert error.total == 3
    assert error.summary == "1 of 2 rows are invalid"


@pytest.mark.parametrize(
    "row", ["ada@example.com,Ada,Hi", "ada@example.com,Ada,Hi,x,extra"], ids=["short", "long"]
)
def test_ragged_rows_are_row_errors(row: str) -> None:
    data = csv_bytes(HEADER, "bob@example.com,Bob,Hi,x", row, "eve@example.com,Eve,Hi,x")

    error = invalid(data)

    (problem,) = error.errors
    assert (problem.field, problem.row) == ("row", 3)
    assert "the header has 4 columns" in problem.reason


def test_duplicates_are_dropped_case_insensitively_and_counted_with_their_rows() -> None:
    data = csv_bytes(
        HEADER,
        "ada@example.com,Ada,First,x",
        "bob@example.com,Bob,Hi,x",
        "ADA@example.com,Ada again,Second,x",
        "Ada@Example.COM,Ada thrice,Third,x",
        "Bob@example.com,Bob again,Hi,x",
        "eve@example.com,Eve,Hi,x",
    )

    result = parse_recipients(data)

    assert [(r.position, r.email, r.subject) for r in result.recipients] == [
        (0, "ada@example.com", "First"),
        (1, "bob@example.com", "Hi"),
        (2, "eve@example.com", "Hi"),
    ]
    assert result.rows == 6
    assert result.duplicates == 3
    assert result.duplicate_rows == [4, 5, 6]


def test_duplicate_rows_listed_are_capped_at_fifty_but_all_counted() -> None:
    data = csv_bytes(HEADER, *["ada@example.com,Ada,Hi,x"] * 80)

    result = parse_recipients(data)

    assert len(result.recipients) == 1
    assert result.duplicates == 79
    assert result.duplicate_rows == list(range(3, 53))


def _big_file(path: pathlib.Path, rows: int, bad: set[int]) -> dict[int, str]:
    """Writes ``rows`` data rows; the indexes in ``bad`` get one problem each.

    Returns the expected field per bad spreadsheet row.
    """
    kinds = ["email", "row", "name", "subject"]
    expected: dict[int, str] = {}
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["email", "name", "subject", "body", "city"])
        for i in range(rows):
            cells = [f"user{i}@example{i % 97}.com", f"User {i}", "", f"Body {i}", "Paris"]
            if i in bad:
                kind = kinds[len(expected) % len(kinds)]
                expected[i + 2] = kind
                if kind == "email":
                    cells[0] = f"user{i}.example.com"
                elif kind == "row":
                    cells.append("surplus")
                elif kind == "name":
                    cells[1] = f"User\r\n{i}"  # also spans two lines in the file
                else:
                    cells[4] = ""  # the template then renders an empty subject
            writer.writerow(cells)
    return expected


def test_ten_thousand_rows_with_scattered_bad_ones_give_one_report(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "big.csv"
    bad = set(random.Random(7).sample(range(10_000), 30))
    expected = _big_file(path, 10_000, bad)
    templates = Templates(subject="{{ city }}")

    with pytest.raises(InvalidInput) as caught:
        parse_recipients(path, templates=templates)

    error = caught.value
    assert error.total == 30
    assert error.summary == "30 of 10000 rows are invalid"
    assert [(e.row, e.field) for e in error.errors] == sorted(expected.items())

    fixed = tmp_path / "fixed.csv"
    _big_file(fixed, 10_000, set())
    result = parse_recipients(fixed, templates=templates)
    assert (len(result.recipients), result.recipients[-1].position) == (10_000, 9_999)


def test_errors_listed_are_capped_and_all_counted(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "bad.csv"
    bad = set(range(0, 1200, 10))
    expected = _big_file(path, 1500, bad)

    with pytest.raises(InvalidInput) as caught:
        parse_recipients(path, templates=Templates(subject="{{ city }}"))

    assert caught.value.total == 120
    assert [e.row for e in caught.value.errors] == sorted(expected)[:50]
    with pytest.raises(InvalidInput) as few:
        parse_recipients(path, templates=Templates(subject="{{ city }}"), max_errors=5)
    assert (len(few.value.errors), few.value.total) == (5, 120)


# --- the file as a whole ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        (b"", "file", "empty"),
        (b"\xef\xbb\xbf", "file", "empty"),
        (b"\r\n\r\n,,\r\n", "file", "empty"),
        (csv_bytes("name,subject,body", "Ada,Hi,x"), "header", "no email column"),
        (csv_bytes("E-mail,name", "ada@example.com,Ada"), "header", "no email column"),
        (csv_bytes("email,name,Email", "a@example.com,A,b@example.com"), "header", "repeats"),
        (csv_bytes("email,City,city", "a@example.com,x,y"), "header", "repeats"),
        (csv_bytes("email,,subject", "a@example.com,x,y"), "header", "column 2 has no name"),
        (csv_bytes(HEADER), "file", "no rows"),
        (csv_bytes(HEADER, "", ""), "file", "no rows"),
    ],
    ids=[
        "empty",
        "only-bom",
        "only-blank",
        "no-email",
        "misspelled-email",
        "duplicate-reserved",
        "duplicate-extra",
        "unnamed",
        "header-only",
        "header-and-blank",
    ],
)
def test_file_and_header_problems(data: bytes, field: str, words: str) -> None:
    error = refused(data)

    assert error.field == field
    assert words in error.reason


def test_too_many_columns() -> None:
    data = csv_bytes("email,subject,body,a,b", "x@example.com,Hi,x,1,2")

    error = refused(data, limits=ImportLimits(max_columns=4))

    assert (error.field, error.value, error.row) == ("header", 5, 1)
    parse_recipients(data, limits=ImportLimits(max_columns=5))


def test_more_rows_than_allowed_is_refused() -> None:
    rows = [f"u{i}@example.com,U,Hi,x" for i in range(4)]

    error = refused(csv_bytes(HEADER, *rows), limits=ImportLimits(max_rows=3))
    result = parse_recipients(csv_bytes(HEADER, "", *rows[:3]), limits=ImportLimits(max_rows=3))

    assert error.field == "file"
    assert "more than 3 rows" in error.reason
    assert result.rows == 3


def test_unterminated_quote_is_a_malformed_file_naming_the_row() -> None:
    data = csv_bytes(HEADER, "ada@example.com,Ada,Hi,x", 'bob@example.com,"Bob,Hi,x', "more,rows")

    error = refused(data)

    assert (error.field, error.row) == ("file", 3)
    assert "malformed CSV" in error.reason


class TestByteLimit:
    limits = ImportLimits(max_bytes=10_000)

    def payload(self, size: int) -> bytes:
        data = csv_bytes(HEADER, *(f"u{i}@example.com,U,Hi,x" for i in range(size // 20)))
        assert len(data) > size
        return data[: data.rindex(b"\r\n", 0, size) + 2]

    def test_bytes_over_the_limit(self) -> None:
        error = refused(self.payload(10_500), limits=self.limits)

        assert error.field == "file"
        assert "larger than 10000 bytes" in error.reason

    def test_exactly_the_limit_is_fine(self) -> None:
        data = self.payload(10_000)
        data += b"\n" * (10_000 - len(data))  # blank lines pad it to the byte

        assert len(data) == 10_000
        assert parse_recipients(data, limits=self.limits).rows > 0
        assert parse_recipients(io.BytesIO(data), limits=self.limits).rows > 0

    def test_stream_reading_stops_soon_after_the_limit(self) -> None:
        stream = io.BytesIO(self.payload(2_000_000))

        error = refused(stream, limits=self.limits)

        assert error.field == "file"
        assert "larger than 10000 bytes" in error.reason
        assert isinstance(error.value, int)
        assert error.value > 10_000
        assert stream.tell() < 200_000  # it did not read the whole stream first

    def test_path_over_the_limit_is_refused_before_reading(self, tmp_path: pathlib.Path) -> None:
        path = tmp_path / "big.csv"
        # Invalid UTF-8 up front: reading it would fail differently than the size check does.
        path.write_bytes(b"\xff" + self.payload(20_000))

        error = refused(path, limits=self.limits)

        assert error.field == "file"
        assert "larger than 10000 bytes" in error.reason
        assert error.value == path.stat().st_size


class TestEncoding:
    def test_invalid_utf8_names_the_byte_offset(self) -> None:
        # A Latin-1 byte (0xf4, "ô") after a correctly encoded "é".
        data = csv_bytes(HEADER, "ada@example.com,Ada,Hi,x") + b"b@example.com,J\xc3\xa9r\xf4me"
        at = data.index(b"\xf4")

        error = refused(data)

        assert error.field == "file"
        assert f"at byte {at} " in error.reason
        assert "not UTF-8" in error.reason
        assert "line 3" in error.reason
        assert error.value == b"\xf4"

    def test_offset_counts_the_bom_and_survives_chunk_boundaries(self) -> None:
        rows = [f"user{i}@example.com,Jérôme {i},Hi,x" for i in range(20_000)]
        data = bytearray(csv_bytes(HEADER, *rows, bom=True))
        at = data.index(b"J\xc3\xa9r\xc3\xb4me 15000") + 3
        data[at] = 0xFF

        error = refused(bytes(data))

        assert f"at byte {at} " in error.reason

    def test_utf16_is_recognised(self) -> None:
        data = "email,subject,body\r\nada@example.com,Hi,x\r\n".encode("utf-16")

        error = refused(data)

        assert "not UTF-8 (it looks like UTF-16)" in error.reason
        assert "at byte 0 " in error.reason

    def test_non_ascii_text_reads_fine(self) -> None:
        data = csv_bytes(HEADER, "jörg@bücher.example,Jörg Ünal 中文,Grüße 👋,Text")

        (recipient,) = parse_recipients(data).recipients

        assert recipient.email == "jörg@bücher.example"
        assert (recipient.name, recipient.subject) == ("Jörg Ünal 中文", "Grüße 👋")


# --- properties -------------------------------------------------------------------------------

header_text = st.characters(exclude_categories=("Cc", "Cs"), exclude_characters="\u2028\u2029")


@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(
    names=st.lists(st.text(header_text, max_size=40), min_size=1, max_size=5),
    subjects=st.lists(
        st.text(header_text, min_size=1, max_size=60).filter(str.strip), min_size=5, max_size=5
    ),
    bom=st.booleans(),
)
def test_names_and_subjects_round_trip_unchanged(
    names: list[str], subjects: list[str], bom: bool
) -> None:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["email", "name", "subject", "body"])
    for i, name in enumerate(names):
        writer.writerow([f"user{i}@example.com", name, subjects[i], f"Body {i}"])
    data = out.getvalue().encode()

    result = parse_recipients(b"\xef\xbb\xbf" + data if bom else data)

    assert [r.name for r in result.recipients] == names
    assert [r.subject for r in result.recipients] == subjects[: len(names)]


local_parts = st.one_of(
    st.text(st.sampled_from("aZ09._+-!#'\"é@ "), min_size=0, max_size=70),
    st.sampled_from(["Postmaster", "INFO", "Sales", "john.smith", "a" * 64, "a" * 65, "x..y"]),
)
labels = st.sampled_from(
    ["example", "EXAMPLE", "xn--bcher-kva", "bücher", "localhost", "test", "invalid", "123",
     "a" * 63, "a" * 64, "-bad", "ok-", "com", "c0m", "org", "b" * 60, "[1.2.3.4]", ""]
)  # fmt: skip
domains = st.lists(labels, min_size=1, max_size=5).map(".".join)


@settings(deadline=None, max_examples=400)
@given(local=local_parts, domain=domains)
def test_addresses_are_normalized_exactly_as_email_validator_does(local: str, domain: str) -> None:
    address = f"{local}@{domain}"
    primer = f"primer@{domain}"  # the same domain first, so the address may take the fast path
    quoted = '"' + address.replace('"', '""') + '"'
    data = csv_bytes("email,subject,body", f'"{primer}",Hi,x', f"{quoted},Hi,x")
    try:
        expected: str | None = validate_email(
            address.strip(), check_deliverability=False
        ).normalized
    except EmailNotValidError:
        expected = None

    try:
        result = parse_recipients(data)
    except InvalidInput as error:
        at_address = [e for e in error.errors if e.row == 3]
        assert [e.field for e in at_address] == ([] if expected else ["email"])
    else:
        assert result.recipients[1].email == expected
