"""Import a campaign's recipients from a CSV file, with mail-merge templates.

The contract the CLI, the web app and the campaign service rely on:

* **Header.** The first non-blank record names the columns. ``email`` is required; ``name``,
  ``subject``, ``body``, ``html`` and ``timezone`` are optional; every other column is a
  template variable.
  Names are trimmed and matched case-insensitively; they must be unique (ignoring case) and not
  empty. Extra columns keep their spelling as variable names.
* **Cells are literal text**, never templates. A non-empty ``subject``/``body``/``html`` cell wins
  over the matching template; an empty one falls back to it. Only the address is trimmed; names,
  subjects, bodies and variables are kept exactly as written.
* **Templates** are Jinja2 in a sandbox with strict undefined: ``email`` (normalized), ``name``,
  each extra column whose name is an identifier, and ``row``, a dict of all of those, for names
  like ``row["My Col"]`` (a column literally named ``row`` is only reachable as
  ``row["row"]``), ``unsubscribe_url``, the email's one-click unsubscribe link (put in
  at send time; a column of that name wins), and ``sender.name``, ``sender.email`` and
  ``sender.signature``, the sender the email goes out from (put in at send time; a column
  named ``sender`` does not hide them, see :mod:`sendqueue.services.templates.render`). The html
  template autoescapes; subject and body do not. Their source size, output size and time per
  row are bounded (:mod:`sendqueue.services.templates.render`, ``ImportLimits.templates``): a
  template past a bound is refused naming its part, a row whose rendering passes one is a
  problem of that row.
* **Rows.** A subject is required (cell or template). The body may be empty only when an html
  part is present. The address must pass email-validator's syntax check (no DNS) and the
  normalized form is kept. Header fields (email, name, subject) must be one line: CR, LF, other
  line separators (U+000B, U+000C, U+001C-U+001E, U+0085, U+2028, U+2029) and control characters
  are refused, since mail software may fold or split a header on them; bodies and variables may
  hold line breaks but no NUL character. Rows whose address repeats an earlier one (ignoring
  case) are dropped without further checks and counted; the first stays.
  Blank records (every cell empty or whitespace) are skipped.
* **Time zone.** A ``timezone`` cell is the recipient's IANA zone (``Europe/Berlin``), trimmed;
  an empty cell (or no column) is None: the campaign's zone. An unknown zone is a problem of
  that row (field ``timezone``, with the value). The zone is kept whether or not the campaign
  is local-time (``campaign create --local-time``); only a local-time campaign reads its
  windows, weekdays and skip dates in it, any other ignores it (its preview says so). The
  column is not a template variable, but templates see it as ``timezone``, as they see
  ``name``.
* **Row numbers** are spreadsheet row numbers: the n-th CSV record, blank ones included, so the
  header is row 1 and a quoted cell with embedded newlines does not shift later rows.
* **All or nothing.** Every row is checked. If any is invalid, :class:`InvalidInput` is raised
  with the first ``max_errors`` problems (one :class:`InvalidField` per bad field, with its row)
  and the total count; nothing is returned. A problem with the file as a whole (too large, not
  UTF-8, malformed quoting, bad header, too many rows, no rows) raises one :class:`InvalidField`
  with field ``file`` or ``header`` at once.

The file is read as a stream and its bytes are counted as they come, so a huge upload is refused
after ``max_bytes`` without being held in memory.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import os
import re
import sys
import zoneinfo
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from email_validator import EmailNotValidError
from jinja2 import Template, TemplateError

from sendqueue.domain.errors import InvalidField, InvalidInput
from sendqueue.domain.models import Recipient
from sendqueue.domain.policy import load_timezone
from sendqueue.services.importing.addresses import AddressNormalizer
from sendqueue.services.importing.csv_source import text_lines
from sendqueue.services.templates.render import (
    CompiledTemplates,
    TemplateLimits,
    Templates,
    compile_templates,
)

__all__ = [
    "CompiledTemplates",
    "ImportLimits",
    "ImportResult",
    "RowImporter",
    "TemplateLimits",
    "Templates",
    "compile_templates",
    "parse_recipients",
    "stream_recipients",
]

# Columns with a meaning of their own; every other column is a template variable.
_RESERVED = ("email", "name", "subject", "body", "html", "timezone")
# How many duplicate row numbers an ImportResult lists.
_DUPLICATE_ROWS_SHOWN = 50
# An address longer than this cannot be valid (RFC 5321 allows 254); refusing it before
# email-validator keeps a megabyte-long cell from costing a megabyte of regex work.
_EMAIL_PRECHECK_CHARS = 1024
# Values quoted back in error messages are cut to this length.
_VALUE_SHOWN_CHARS = 200
_NO_TEMPLATES = Templates()


# No email may carry a NUL (RFC 5322), and PostgreSQL refuses one in any text column.
_NUL_REASON = "contains the NUL character (U+0000), which no email may carry"
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_LINE_SEPARATORS = frozenset("\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
#: Reports a problem of the row being checked: its field, the value and why.
_Fail = Callable[[str, object, str], None]


@dataclass(frozen=True)
class ImportLimits:
    """Size limits of one import. Anything larger is refused, naming the limit."""

    max_bytes: int = 50 * 1024 * 1024
    max_rows: int = 1_000_000
    max_field_chars: int = 1_000_000
    """Longest text or html body, and longest cell of any other column."""
    max_subject_chars: int = 998
    max_name_chars: int = 256
    max_columns: int = 200
    templates: TemplateLimits = field(default_factory=TemplateLimits)
    """Source size, output size and time bounds of the templates."""


@dataclass(frozen=True)
class ImportResult:
    """The recipients of a valid file, in file order, duplicates removed."""

    recipients: list[Recipient]
    """Positions 0..n-1 in file order."""
    rows: int
    """Data rows read (blank records not counted)."""
    duplicates: int
    """Rows dropped because their address repeats an earlier row's."""
    duplicate_rows: list[int]
    """Row numbers of the first 50 dropped duplicates."""


def parse_recipients(
    source: bytes | str | os.PathLike[str] | BinaryIO,
    *,
    templates: Templates = _NO_TEMPLATES,
    limits: ImportLimits = ImportLimits(),
    max_errors: int = 50,
) -> ImportResult:
    """Read, render and validate every row of a recipients CSV (see the module docstring).

    ``source`` is the file's content as ``bytes``, a path (``str`` or path-like), or a binary
    stream, which is read but not closed. Raises :class:`InvalidField` for a problem with the
    file as a whole or a template's syntax, and :class:`InvalidInput` listing the first
    ``max_errors`` row problems (``total`` counts all of them) if any row is invalid.
    """
    compiled = compile_templates(templates, limits.templates)
    importer = RowImporter(compiled, limits, max(0, max_errors))
    recipients = list(stream_recipients(source, importer))
    return ImportResult(recipients, importer.rows, importer.duplicates, importer.duplicate_rows)


def stream_recipients(
    source: bytes | str | os.PathLike[str] | BinaryIO, importer: RowImporter
) -> Iterator[Recipient]:
    """The recipients of a CSV as ``importer`` checks them, one at a time, without a list.

    Raises as :func:`parse_recipients` does, a row problem only at the end (no recipient is
    yielded after the first bad row). ``importer`` holds the counts once it is exhausted.
    """
    limits = importer.limits
    # csv has no per-reader limit, only this process-wide one (131072 by default). Raise it, never
    # lower it, so that an oversized cell becomes a row error naming its column and the byte
    # limit stays the only bound on a cell.
    wanted = min(limits.max_bytes + 1, sys.maxsize)
    if csv.field_size_limit() < wanted:
        csv.field_size_limit(wanted)
    with text_lines(source, limits.max_bytes) as lines:
        yield from importer.recipients_of(csv.reader(lines, strict=True))


# --- checking -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Header:
    width: int
    email: int
    name: int | None
    subject: int | None
    body: int | None
    html: int | None
    extras: tuple[tuple[int, str], ...]
    timezone: int | None = None


def _read_header(cells: list[str], row: int, limits: ImportLimits) -> _Header:
    if len(cells) > limits.max_columns:
        raise InvalidField(
            "header",
            len(cells),
            f"{len(cells)} columns; at most {limits.max_columns} are allowed",
            row=row,
        )
    names = [cell.strip() for cell in cells]
    shown = _clip(", ".join(names))
    seen: dict[str, int] = {}
    for index, name in enumerate(names):
        if not name:
            raise InvalidField(
                "header", shown, f"column {index + 1} has no name; name it or delete it", row=row
            )
        key = name.casefold()
        if key in seen:
            raise InvalidField(
                "header",
                shown,
                f"column {index + 1} ({name!r}) repeats the name of column {seen[key] + 1}; "
                "column names must be unique, ignoring case",
                row=row,
            )
        seen[key] = index
    if "email" not in seen:
        raise InvalidField(
            "header",
            shown,
            "no email column; the first row must name the columns, one of them 'email'",
            row=row,
        )
    return _Header(
        width=len(names),
        email=seen["email"],
        name=seen.get("name"),
        subject=seen.get("subject"),
        body=seen.get("body"),
        html=seen.get("html"),
        timezone=seen.get("timezone"),
        extras=tuple(
            (index, name) for index, name in enumerate(names) if name.casefold() not in _RESERVED
        ),
    )


class RowImporter:
    """One pass over the records: the header, then every row, collecting problems."""

    def __init__(self, templates: CompiledTemplates, limits: ImportLimits, max_errors: int):
        self.templates = templates
        self.limits = limits
        self.max_errors = max_errors
        self.errors: list[InvalidField] = []
        self.problems = 0
        self.bad_rows = 0
        self.rows = 0
        self.count = 0
        # 64-bit hashes of the normalised addresses: a million of them take about 60 MB where
        # the addresses would take twice that (a false duplicate: p < 3e-8 for 1M addresses).
        self.seen: set[int] = set()
        self.addresses = AddressNormalizer()
        self.duplicates = 0
        self.duplicate_rows: list[int] = []
        self.zoned = 0
        """Recipients with a zone of their own (a ``timezone`` cell)."""
        self._zones: set[str] = set()  # the zones already found valid

    def run(self, reader: Iterator[list[str]]) -> ImportResult:
        recipients = list(self.recipients_of(reader))
        return ImportResult(recipients, self.rows, self.duplicates, self.duplicate_rows)

    def recipients_of(self, reader: Iterator[list[str]]) -> Iterator[Recipient]:
        header: _Header | None = None
        record = 0
        try:
            for cells in reader:
                record += 1
                if not "".join(cells).strip():
                    continue
                if header is None:
                    header = _read_header(cells, record, self.limits)
                    self._check_parts_available(header)
                    continue
                self.rows += 1
                if self.rows > self.limits.max_rows:
                    raise InvalidField(
                        "file",
                        self.rows,
                        f"more than {self.limits.max_rows} rows; split the file",
                        row=record,
                    )
                if (recipient := self._row(header, cells, record)) is not None:
                    yield recipient
        except csv.Error as exc:
            line = getattr(reader, "line_num", None)
            raise InvalidField(
                "file",
                f"line {line}",
                f"malformed CSV ({exc}) in the record that starts at row {record + 1}; a quote "
                'inside a cell must be doubled ("") and a quoted cell must be closed',
                row=record + 1,
            ) from exc
        if header is None:
            raise InvalidField(
                "file", "", "empty; expected a header row naming the columns, one of them 'email'"
            )
        if self.rows == 0:
            raise InvalidField("file", 0, "no rows below the header; add at least one recipient")
        if self.problems:
            raise InvalidInput(
                f"{self.bad_rows} of {self.rows} rows are invalid", self.errors, total=self.problems
            )

    def _check_parts_available(self, header: _Header) -> None:
        # Without a column or a template every row would fail alike: say it once instead.
        if header.subject is None and self.templates.subject is None:
            raise InvalidField(
                "subject",
                None,
                "no subject column and no subject template; give a subject column or --subject",
            )
        if (
            header.body is None
            and header.html is None
            and self.templates.body is None
            and self.templates.html is None
        ):
            raise InvalidField(
                "body",
                None,
                "no body or html column and no body template; give a body column or --body-file",
            )

    def _row(self, header: _Header, cells: list[str], record: int) -> Recipient | None:
        errors: list[InvalidField] = []

        def fail(field_: str, value: object, why: str) -> None:
            errors.append(InvalidField(field_, _clip(value), why, row=record))

        if len(cells) != header.width:
            fail(
                "row",
                f"{len(cells)} cells",
                f"has {len(cells)} cells but the header has {header.width} columns; "
                "quote cells that contain a comma",
            )
            self._report(errors)
            return None
        limits = self.limits
        email = self._email(cells[header.email].strip(), record, fail)
        if email is None:
            return None  # a repeated address: dropped and counted, nothing else checked
        name = cells[header.name] if header.name is not None else ""
        if len(name) > limits.max_name_chars:
            fail("name", name, f"longer than {limits.max_name_chars} characters")
        elif (why := _header_problem(name)) is not None:
            fail("name", name, why)
        timezone = self._timezone(header, cells, fail)
        variables = {column: cells[index] for index, column in header.extras}
        for column, value in variables.items():
            if len(value) > limits.max_field_chars:
                fail(column, value, f"longer than {limits.max_field_chars} characters")
            elif "\x00" in value:
                fail(column, value, _NUL_REASON)
        row = {**variables, "email": email, "name": name}
        if header.timezone is not None:
            row["timezone"] = timezone or ""
        subject, body, html = self._parts(header, cells, row, fail)
        self._check_parts(subject, body, html, fail)
        if errors:
            self._report(errors)
            return None
        if self.problems:
            # The import has already failed; building recipients would only cost memory.
            return None
        # No errors means every part rendered.
        assert subject is not None
        assert body is not None
        self.count += 1
        if timezone is not None:
            self.zoned += 1
        return Recipient(
            self.count - 1, email, name, subject, body, html or None, variables, timezone
        )

    def _email(self, email: str, record: int, fail: _Fail) -> str | None:
        """The row's address, normalized (as given when it is reported with ``fail``); None
        when it repeats an earlier row's, which drops the row."""
        if not email:
            fail("email", email, "empty; every row needs an address")
        elif (why := _header_problem(email)) is not None:
            fail("email", email, why)
        elif len(email) > _EMAIL_PRECHECK_CHARS:
            fail("email", email, "too long for an address (at most 254 characters)")
        else:
            try:
                email = self.addresses.normalize(email)
            except EmailNotValidError as exc:
                fail("email", email, f"not a valid address: {exc}")
            else:
                key = _address_key(email)
                if key in self.seen:
                    self.duplicates += 1
                    if len(self.duplicate_rows) < _DUPLICATE_ROWS_SHOWN:
                        self.duplicate_rows.append(record)
                    return None
                self.seen.add(key)
        return email

    def _parts(
        self, header: _Header, cells: list[str], row: dict[str, str], fail: _Fail
    ) -> tuple[str | None, str | None, str | None]:
        """The subject, body and html of the row: its cell, else its template rendered with
        the row's values (``row``); None for a template that failed (reported with ``fail``)."""
        context: dict[str, object] | None = None

        def part(field_: str, index: int | None, template: Template | None) -> str | None:
            nonlocal context
            cell = cells[index] if index is not None else ""
            if cell or template is None:
                return cell
            if context is None:
                context = {**row, "row": row}
            try:
                return self.templates.render(field_, context)
            # A user's template can raise anything (an undefined name, 1/0, a sandbox refusal):
            # all of it is this row's problem, reported and counted like any other.
            except Exception as exc:
                why = exc.message if isinstance(exc, TemplateError) else None
                source = getattr(self.templates.sources, field_)
                fail(field_, source, f"template failed: {why or f'{type(exc).__name__}: {exc}'}")
                return None

        self.templates.start_row()
        try:
            subject = part("subject", header.subject, self.templates.subject)
            body = part("body", header.body, self.templates.body)
            html = part("html", header.html, self.templates.html)
        finally:
            self.templates.end_row()
        return subject, body, html

    def _check_parts(
        self, subject: str | None, body: str | None, html: str | None, fail: _Fail
    ) -> None:
        """Report (with ``fail``) a subject that is empty, too long or no header, a body or
        html that is too long or holds a NUL, and a row with neither body nor html."""
        limits = self.limits
        if subject is not None:
            if not subject.strip():
                fail("subject", subject, "empty; give a subject column or --subject")
            elif len(subject) > limits.max_subject_chars:
                fail("subject", subject, f"longer than {limits.max_subject_chars} characters")
            elif (why := _header_problem(subject)) is not None:
                fail("subject", subject, why)
        for field_, text in (("body", body), ("html", html)):
            if text is not None and len(text) > limits.max_field_chars:
                fail(field_, text, f"longer than {limits.max_field_chars} characters")
            elif text is not None and "\x00" in text:
                fail(field_, text, _NUL_REASON)
        if body is not None and html is not None and not body.strip() and not html.strip():
            fail("body", body, "empty; give a body or an html part (column, or --body-file)")

    def _timezone(self, header: _Header, cells: list[str], fail: _Fail) -> str | None:
        """The row's ``timezone`` cell, trimmed, or None when empty or missing; an unknown
        zone is reported (with ``fail``) and gives None."""
        if header.timezone is None:
            return None
        zone = cells[header.timezone].strip()
        if not zone:
            return None
        if zone not in self._zones:
            try:
                load_timezone(zone, "timezone")
            except InvalidField as exc:
                known = _zones_by_casefold().get(zone.casefold())
                why = (
                    f"unknown IANA timezone; did you mean {known}? Zone names are case-sensitive"
                    if known
                    else exc.reason
                )
                fail("timezone", zone, why)
                return None
            self._zones.add(zone)
        return zone

    def _report(self, errors: list[InvalidField]) -> None:
        self.bad_rows += 1
        self.problems += len(errors)
        room = self.max_errors - len(self.errors)
        if room > 0:
            self.errors.extend(errors[:room])


@functools.cache
def _zones_by_casefold() -> dict[str, str]:
    """Every IANA zone name by its casefolded spelling, for a hint on a miscased name."""
    return {name.casefold(): name for name in zoneinfo.available_timezones()}


def _address_key(email: str) -> int:
    return int.from_bytes(hashlib.blake2b(email.lower().encode(), digest_size=8).digest())


def _header_problem(value: str) -> str | None:
    """Why ``value`` cannot go into a mail header, or None if it can."""
    found = _CONTROL.search(value)
    if found is None:
        return None
    char = found.group()
    if char in "\r\n":
        return "contains a line break (CR or LF); a mail header must be one line"
    if char in _LINE_SEPARATORS:
        return f"contains the line separator U+{ord(char):04X}; a mail header must be one line"
    return f"contains the control character U+{ord(char):04X}"


def _clip(value: object) -> object:
    if isinstance(value, str) and len(value) > _VALUE_SHOWN_CHARS:
        return value[:_VALUE_SHOWN_CHARS] + f"... ({len(value)} characters)"
    return value
