"""Recipients given as mappings (the API's JSON), checked by the CSV rules of
:mod:`sendqueue.services.importing.recipients`: each mapping becomes a CSV record of the columns
all of
them name, and the same :class:`~sendqueue.services.importing.recipients.RowImporter` checks
them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from sendqueue.domain.errors import InvalidField, InvalidInput
from sendqueue.services.importing.recipients import (
    ImportLimits,
    ImportResult,
    RowImporter,
    Templates,
    _clip,
    compile_templates,
)

__all__ = ["parse_recipient_rows"]

_NO_TEMPLATES = Templates()
_LIMITS = ImportLimits()


def parse_recipient_rows(
    rows: Sequence[Mapping[str, object]],
    *,
    templates: Templates = _NO_TEMPLATES,
    limits: ImportLimits = _LIMITS,
    max_errors: int = 50,
) -> ImportResult:
    """Render and validate recipients given as mappings (the API's JSON), by the CSV rules.

    Each mapping is one row: its keys are the columns (``email`` required; ``name``,
    ``subject``, ``body``, ``html``, ``timezone`` optional; every other key a template
    variable), and a
    missing key is an empty cell. Values are text; numbers are taken as their text and
    ``None`` as empty; anything else (a list, a mapping, a boolean) is a problem of that row
    and key. Unlike a CSV file, an empty row is not skipped: it is a row without an address.
    Row numbers count the first recipient as row 2, as if the rows came from a CSV file with a
    header. A problem with the rows as a whole (none at all, too many, a key that is empty or
    repeats another ignoring case, too many keys) raises one :class:`InvalidField` naming
    ``recipients``; row problems raise :class:`InvalidInput` as
    :func:`~sendqueue.services.importing.recipients.parse_recipients` does.
    """
    if isinstance(rows, str | bytes) or not isinstance(rows, Sequence):
        raise InvalidField("recipients", _clip(repr(rows)), "expected a list of objects")
    if not rows:
        raise InvalidField("recipients", 0, "no recipients; give at least one")
    if len(rows) > limits.max_rows:
        raise InvalidField(
            "recipients", len(rows), f"more than {limits.max_rows} rows; send fewer at once"
        )
    compiled = compile_templates(templates, limits.templates)
    names = _columns(rows)
    early: list[InvalidField] = []
    importer = RowImporter(compiled, limits, max(0, max_errors))
    problems: list[InvalidField] = []
    total = 0
    try:
        result = importer.run(_records(names, rows, early))
    except InvalidInput as exc:
        problems, total = exc.errors, exc.total
    except InvalidField as exc:
        if early and importer.rows == 0:
            pass  # every row was bad before the importer saw it: report those problems
        elif exc.field in {"header", "file"}:
            # The CSV wording names a header or a file; here that is the list as a whole.
            raise InvalidField("recipients", exc.value, exc.reason) from exc
        else:
            raise
    else:
        if not early:
            return result
    found = sorted([*early, *problems], key=lambda e: e.row or 0)
    raise InvalidInput(
        f"{importer.bad_rows + len({e.row for e in early})} of {len(rows)} rows are invalid",
        found[: max(0, max_errors)],
        total=total + len(early),
    )


def _columns(rows: Sequence[Mapping[str, object]]) -> list[str]:
    """The keys of all rows in order of first appearance, ``email`` first, so a row without
    an address is that row's problem rather than a bad header."""
    columns: dict[str, None] = {"email": None}
    for row in rows:
        if isinstance(row, Mapping):
            for key in row:
                if not isinstance(key, str):
                    raise InvalidField("recipients", _clip(repr(key)), "keys must be text")
                columns.setdefault(key, None)
    return list(columns)


def _records(
    names: list[str], rows: Sequence[Mapping[str, object]], early: list[InvalidField]
) -> Iterator[list[str]]:
    """The rows as CSV records, the header first; the problems found on the way go to
    ``early``."""
    yield names
    blank = [""] * len(names)
    for index, row in enumerate(rows):
        yield _cells(names, blank, index + 2, row, early)


def _cells(
    names: list[str], blank: list[str], number: int, row: object, early: list[InvalidField]
) -> list[str]:
    """Row ``number`` as CSV cells; a row with a problem found here becomes a blank record,
    which the importer skips (its row number still counts), so it is reported once."""
    if not isinstance(row, Mapping):
        early.append(InvalidField("row", _clip(repr(row)), "expected an object", row=number))
        return blank
    cells: list[str] = []
    bad = False
    for name in names:
        value = row.get(name)
        if value is None:
            cells.append("")
        elif isinstance(value, str):
            cells.append(value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            cells.append(str(value))
        else:
            early.append(InvalidField(name, _clip(repr(value)), "expected text", row=number))
            bad = True
            cells.append("")
    if not bad and not "".join(cells).strip():
        early.append(InvalidField("email", "", "empty; every row needs an address", row=number))
        bad = True
    return blank if bad else cells
