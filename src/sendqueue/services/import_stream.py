"""A recipients import in two passes, so that a million rows are never in memory at once.

The first pass reads, renders and checks every row by the rules of
:mod:`sendqueue.services.importing`, keeping only the counts, the duplicate check's hashes and
the first addresses; a rejected import raises then, before anything is stored. The second pass
reads the source again and yields the same recipients one at a time, for a store that writes
them in chunks (:meth:`sendqueue.ports.TaskStore.create_campaign`). A stream source is rewound
for it, or copied to a temporary file first when it cannot seek.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from sendqueue.domain.errors import InvalidField
from sendqueue.domain.models import Recipient
from sendqueue.services.csv_source import LimitedReader
from sendqueue.services.importing import (
    ImportLimits,
    RowImporter,
    Templates,
    compile_templates,
    parse_recipient_rows,
    stream_recipients,
)

__all__ = ["FIRST_EMAILS_KEPT", "CheckedImport", "check_csv", "check_rows"]

#: How many addresses a checked import keeps for a preview of its first sends.
FIRST_EMAILS_KEPT = 1000

Source = bytes | str | os.PathLike[str] | BinaryIO


@dataclass(frozen=True)
class CheckedImport:
    """A valid import: its counts, its first addresses, and its recipients on demand."""

    count: int
    """Recipients (rows less duplicates)."""
    rows: int
    """Data rows read (blank records not counted)."""
    duplicates: int
    duplicate_rows: list[int]
    first_emails: list[str]
    """The addresses of the first :data:`FIRST_EMAILS_KEPT` recipients."""
    _again: Callable[[], Iterator[Recipient]] = field(repr=False, compare=False)

    def recipients(self) -> Iterator[Recipient]:
        """The recipients in file order, positions 0..count-1, read again from the source."""
        return self._again()


def check_csv(
    source: Source,
    *,
    templates: Templates | None = None,
    limits: ImportLimits | None = None,
    max_errors: int = 50,
) -> CheckedImport:
    """Check a recipients CSV whole (raising as :func:`parse_recipients` does) without keeping
    its recipients; :meth:`CheckedImport.recipients` reads them again.

    A stream is read from where it stands and must stay open while the recipients are used.
    """
    limits = limits or ImportLimits()
    compiled = compile_templates(templates or Templates(), limits.templates)
    original = source
    source, start = _rereadable(source, limits.max_bytes)

    def importer() -> RowImporter:
        return RowImporter(compiled, limits, max(0, max_errors))

    def read() -> Iterator[Recipient]:
        if not isinstance(source, bytes | str | os.PathLike):
            source.seek(start)
        return stream_recipients(source, importer())

    first = importer()
    emails: list[str] = []
    for recipient in stream_recipients(source, first):
        if len(emails) < FIRST_EMAILS_KEPT:
            emails.append(recipient.email)
    count = first.count

    def again() -> Iterator[Recipient]:
        seen = 0
        for recipient in read():
            seen += 1
            yield recipient
        if seen != count:
            raise InvalidField("file", seen, "changed while it was imported; import it again")

    checked = CheckedImport(
        count, first.rows, first.duplicates, first.duplicate_rows, emails, again
    )
    if source is not original and not isinstance(source, bytes | str | os.PathLike):
        weakref.finalize(checked, source.close)  # the temporary copy lives as long as this
    return checked


def check_rows(
    rows: Sequence[Mapping[str, object]],
    *,
    templates: Templates | None = None,
    limits: ImportLimits | None = None,
    max_errors: int = 50,
) -> CheckedImport:
    """:func:`parse_recipient_rows` as a :class:`CheckedImport` (the rows are in memory
    already: the API bounds a JSON body's size)."""
    result = parse_recipient_rows(
        rows,
        templates=templates or Templates(),
        limits=limits or ImportLimits(),
        max_errors=max_errors,
    )
    recipients = result.recipients
    return CheckedImport(
        len(recipients),
        result.rows,
        result.duplicates,
        result.duplicate_rows,
        [r.email for r in recipients[:FIRST_EMAILS_KEPT]],
        lambda: iter(recipients),
    )


def _rereadable(source: Source, limit: int) -> tuple[Source, int]:
    """``source`` and where to start reading it, copied to a temporary file if it is a stream
    that cannot seek (at most ``limit`` bytes; one more is refused as too large)."""
    if isinstance(source, bytes | bytearray | memoryview | str | os.PathLike):
        return bytes(source) if not isinstance(source, str | os.PathLike) else source, 0
    try:
        if source.seekable():
            return source, source.tell()
    except (AttributeError, OSError, ValueError):
        pass
    copy = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the import needs it
    shutil.copyfileobj(LimitedReader(source, limit), copy)
    copy.seek(0)
    return copy, 0
