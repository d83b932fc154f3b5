"""The suppression list as the CLI, the API and the pages act on it: add, remove, page, import
and export (CSV). Addresses are checked and keyed here (:func:`suppression_key`); the store
compares keys exactly (:class:`~sendqueue.ports.SuppressionList`).

An export puts ``'`` before a cell a spreadsheet would take for a formula, and an import takes
it off again (:func:`export_cell`, :func:`import_cell`): an address comes onto the list from
outside (an unsubscribe), and ``=HYPERLINK(...)@example.com`` is a valid one.
"""

from __future__ import annotations

import csv
import io
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import BinaryIO

from sendqueue.domain.errors import InvalidField, InvalidInput, NotFound
from sendqueue.domain.models import utc
from sendqueue.domain.suppression import Suppression, SuppressionReason, suppression_key
from sendqueue.ports import Clock, SuppressionList
from sendqueue.services.importing.csv_source import text_lines

__all__ = [
    "CSV_COLUMNS",
    "IMPORT_CHUNK",
    "MAX_PAGE",
    "Added",
    "Imported",
    "SuppressionService",
    "export_cell",
    "import_cell",
    "parse_csv",
    "to_csv",
]

#: The columns of an export, in order; an import reads ``email`` (required), ``reason``
#: (default manual), ``task_id`` and ``at`` (default now) and ignores any other column.
CSV_COLUMNS = ("email", "reason", "task_id", "at")

#: The largest page :meth:`SuppressionService.page` hands out.
MAX_PAGE = 1000

#: Entries an import hands the store per ``suppress`` call.
IMPORT_CHUNK = 10_000

#: Bad rows an import reports one by one (all are counted).
_MAX_REPORTED = 100

#: First characters that get a ``'`` in an export: a formula's (OWASP's CSV injection list:
#: ``= + - @``, tab, carriage return) and ``'`` itself, so that the import's undoing is exact.
_QUOTED_START = frozenset("=+-@\t\r'")

#: A function that opens an import's source afresh (once per pass) as text lines.
Lines = Callable[[], AbstractContextManager[Iterable[str]]]


@dataclass(frozen=True)
class Added:
    """What adding one address did: the entry on the list now (the earlier one when it was
    listed already, which is kept) and whether it is new."""

    entry: Suppression
    new: bool


@dataclass(frozen=True)
class Imported:
    """What an import did: ``rows`` read, ``added`` new addresses, ``kept`` listed already (or
    repeated in the file)."""

    rows: int
    added: int

    @property
    def kept(self) -> int:
        return self.rows - self.added


def export_cell(value: str) -> str:
    """``value`` as an export writes it: behind a ``'`` when it starts with one of
    ``= + - @``, a tab, a carriage return or ``'`` (a spreadsheet shows the rest as text)."""
    return "'" + value if value[:1] in _QUOTED_START else value


def import_cell(cell: str) -> str:
    """A cell as an import reads it: one leading ``'`` dropped when one of the characters
    :func:`export_cell` quotes follows it, so that ``import_cell(export_cell(v)) == v``."""
    return cell[1:] if cell[:1] == "'" and cell[1:2] in _QUOTED_START else cell


def parse_csv(text: str, *, now: datetime) -> list[Suppression]:
    """The entries of a CSV text (its header names the columns, see :data:`CSV_COLUMNS`).

    Raises as :meth:`SuppressionService.import_file` does, and returns nothing then.
    """
    rows = _text_lines(text)
    with rows() as lines:
        _check(lines, now)
    with rows() as lines:
        return list(_entries(lines, now))


def _text_lines(text: str) -> Lines:
    return lambda: nullcontext(io.StringIO(text.lstrip("\ufeff"), newline=""))


def _check(lines: Iterable[str], now: datetime) -> int:
    """The data rows of a good file. Every bad row is reported with its row number (the
    header is row 1) in one InvalidInput: an import is all or nothing."""
    rows = total_problems = 0
    problems: list[InvalidField] = []
    for _, entry in _read(lines, now):
        if isinstance(entry, InvalidField):
            total_problems += 1
            if len(problems) < _MAX_REPORTED:
                problems.append(entry)
        rows += 1
    if total_problems:
        raise InvalidInput("the suppression file has bad rows", problems, total=total_problems)
    return rows


def _entries(lines: Iterable[str], now: datetime) -> Iterator[Suppression]:
    """The entries of a file :func:`_check` passed; a bad row now means it changed since."""
    for number, entry in _read(lines, now):
        if isinstance(entry, InvalidField):
            raise InvalidField(
                "file",
                None,
                f"changed while it was imported: row {number} is bad now ({entry.field}: "
                f"{entry.reason}); the chunks written before it stay",
                row=number,
            )
        yield entry


def _read(lines: Iterable[str], now: datetime) -> Iterator[tuple[int, Suppression | InvalidField]]:
    """Each data row's number and its entry or its problem. No header, no email column or
    a record the csv module cannot read raises InvalidField naming ``file``."""
    rows = _records(csv.reader(lines))
    header = next((row for _, row in rows if any(cell.strip() for cell in row)), None)
    if header is None:
        raise InvalidField("file", "", "empty; expected a header row with an 'email' column")
    columns = {name.strip().lower(): i for i, name in reversed(list(enumerate(header)))}
    if "email" not in columns:
        raise InvalidField("file", ",".join(header), "no email column in the header row")
    for number, row in rows:
        if any(cell.strip() for cell in row):
            yield number, _entry(row, columns, now, number)


def _entry(
    row: list[str], columns: dict[str, int], now: datetime, number: int
) -> Suppression | InvalidField:
    def cell(name: str) -> str:
        at = columns.get(name)
        return import_cell(row[at]).strip() if at is not None and at < len(row) else ""

    try:
        email = suppression_key(cell("email"))
        reason = SuppressionReason.parse(cell("reason") or "manual")
        when = _parse_at(cell("at")) if cell("at") else now
        return Suppression(email, reason, cell("task_id") or None, when)
    except InvalidField as exc:
        return InvalidField(exc.field, exc.value, exc.reason, row=number)


def _records(reader: Iterator[list[str]]) -> Iterator[tuple[int, list[str]]]:
    """The reader's records with their 1-based numbers (the import's row numbers); one the
    csv module cannot read is an InvalidField naming its row."""
    record = 0
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise InvalidField(
                "file",
                None,
                f"malformed CSV ({exc}); a quote inside a cell must be doubled and a quoted "
                "cell closed",
                row=record + 1,
            ) from exc
        record += 1
        yield record, row


def _parse_at(value: str) -> datetime:
    try:
        return utc(datetime.fromisoformat(value.replace("Z", "+00:00")))
    except ValueError as exc:
        raise InvalidField(
            "at", value, "an ISO-8601 time with its offset, e.g. 2026-12-01T09:00:00Z"
        ) from exc


def to_csv(entries: Iterator[Suppression]) -> Iterator[str]:
    """The entries as CSV text, the header line first, one line per entry, each cell as
    :func:`export_cell` writes it."""
    buffer = io.StringIO()
    # The writer quotes a cell holding a character of its line terminator, so "\r\n" (a
    # bare "\n" would leave a CR inside a cell unquoted, and the import would split the row
    # there); the lines end in "\n" all the same.
    writer = csv.writer(buffer, lineterminator="\r\n")

    def line(values: tuple[str, ...]) -> str:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow([export_cell(v) for v in values])
        return buffer.getvalue()[:-2] + "\n"

    yield line(CSV_COLUMNS)
    for e in entries:
        at = e.at.isoformat().replace("+00:00", "Z")
        yield line((e.email, e.reason.value, e.task_id or "", at))


class SuppressionService:
    """The suppression list's use cases over the port."""

    def __init__(self, suppressions: SuppressionList, clock: Clock) -> None:
        self._list = suppressions
        self._clock = clock

    def add(
        self,
        email: str,
        reason: SuppressionReason | str = SuppressionReason.MANUAL,
        *,
        task_id: str | None = None,
    ) -> Added:
        """Put ``email`` on the list (an address listed already keeps its first entry)."""
        key = suppression_key(email)
        entry = Suppression(key, SuppressionReason.parse(reason), task_id, self._clock.now())
        new = self._list.suppress([entry]) == 1
        if new:
            return Added(entry, True)
        stored = self._list.suppressed([key]).get(key)
        # Removed again between the two calls: what we wrote is gone too; report ours.
        return Added(stored or entry, False)

    def remove(self, email: str) -> str:
        """Take ``email`` off the list; NotFound when it is not on it. Returns its key."""
        key = suppression_key(email)
        if not self._list.unsuppress(key):
            raise NotFound("suppressed address", key)
        return key

    def get(self, email: str) -> Suppression | None:
        """The entry of ``email``, or None when it is not listed."""
        key = suppression_key(email)
        return self._list.suppressed([key]).get(key)

    def page(self, *, after: str | None = None, limit: int = 100) -> list[Suppression]:
        """A page of the list in address order, after the address ``after``."""
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidField("limit", limit, f"must be between 1 and {MAX_PAGE}")
        return self._list.list_suppressions(after=after, limit=limit)

    def count(self) -> int:
        return self._list.count_suppressions()

    def all(self, *, page: int = MAX_PAGE) -> Iterator[Suppression]:
        """Every entry in address order, read a page at a time (for an export). The first
        page is read before this returns, so an unreachable store raises here, not midway
        through the iteration (an HTTP export answers 503 instead of a cut-off body)."""
        first = self._list.list_suppressions(limit=page)
        return self._rest(first, page)

    def _rest(self, entries: list[Suppression], page: int) -> Iterator[Suppression]:
        while entries:
            yield from entries
            if len(entries) < page:
                return
            entries = self._list.list_suppressions(after=entries[-1].email, limit=page)

    def import_csv(self, text: str) -> Imported:
        """:meth:`import_file` of a CSV text already in memory."""
        return self._import(_text_lines(text))

    def import_file(
        self, source: os.PathLike[str] | BinaryIO, *, max_bytes: int | None = None
    ) -> Imported:
        """Add every row of a CSV file (UTF-8, a BOM allowed; the header names the columns,
        see :data:`CSV_COLUMNS`): all rows or, with a bad one, none.

        Two passes, so that a big file is never in memory: the first reads and checks every
        row and raises InvalidInput listing the bad ones (the first 100, all counted) before
        anything is written; the second reads the file again and hands the store
        :data:`IMPORT_CHUNK` entries at a time. A path is opened once per pass; a stream (an
        upload's spooled file) must be seekable and is read from its start each time. Each
        chunk is its own write, so a store failure midway leaves the chunks written so far
        (importing the file again adds the rest: the list keeps an address's first entry).
        More than ``max_bytes`` is an InvalidField naming ``file``, as is a byte that is not
        UTF-8 (before anything is written).
        """
        limit = sys.maxsize if max_bytes is None else max_bytes
        return self._import(lambda: text_lines(source, limit, rewind=True))

    def _import(self, lines: Lines) -> Imported:
        now = self._clock.now()
        with lines() as first:
            rows = _check(first, now)
        added = written = 0
        with lines() as second:
            entries = _entries(second, now)
            while chunk := list(islice(entries, IMPORT_CHUNK)):
                added += self._list.suppress(chunk)
                written += len(chunk)
        if written != rows:
            raise InvalidField(
                "file",
                None,
                f"changed while it was imported ({rows} rows checked, then {written} read)",
            )
        return Imported(rows=rows, added=added)
