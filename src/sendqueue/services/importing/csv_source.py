"""Reading an uploaded CSV file's bytes for an import: a size limit counted as the bytes come,
and UTF-8 lines whose first undecodable byte is named by its offset."""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, BinaryIO

from sendqueue.domain.errors import InvalidField

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = [
    "LimitedReader",
    "open_binary",
    "source_name",
    "text_lines",
    "too_large",
    "utf8_lines",
]

#: Bytes read from the source at a time.
_READ_BUFFER = 1 << 16


class LimitedReader(io.RawIOBase):
    """Counts the bytes read from ``raw`` and refuses to go past ``limit``."""

    def __init__(self, raw: BinaryIO, limit: int) -> None:
        self._raw = raw
        self._limit = limit
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        data = self._raw.read(len(view)) or b""
        n = len(data)
        view[:n] = data
        self.count += n
        if self.count > self._limit:
            raise too_large(self.count, self._limit)
        return n


@contextmanager
def open_binary(
    source: bytes | str | os.PathLike[str] | BinaryIO, limit: int
) -> Iterator[BinaryIO]:
    if isinstance(source, bytes | bytearray | memoryview):
        if len(source) > limit:
            raise too_large(len(source), limit)
        yield io.BytesIO(source)
    elif isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        try:
            size = os.stat(path).st_size
            fh = open(path, "rb")  # noqa: SIM115 - closed by the with below
        except OSError as exc:
            raise InvalidField("file", path, f"cannot be read: {exc.strerror or exc}") from exc
        with fh:
            if size > limit:
                raise too_large(size, limit)
            yield fh
    else:
        yield source


@contextmanager
def text_lines(
    source: bytes | str | os.PathLike[str] | BinaryIO, limit: int, *, rewind: bool = False
) -> Iterator[Iterator[str]]:
    """The lines of ``source`` as :func:`utf8_lines` gives them, at most ``limit`` bytes. A
    stream is read from where it stands, or from its start with ``rewind`` (a second pass);
    it stays open. A failed read is an InvalidField naming ``file``."""
    with open_binary(source, limit) as raw:
        buffered = io.BufferedReader(LimitedReader(raw, limit), _READ_BUFFER)
        # surrogateescape keeps going past an invalid byte so utf8_lines can name its offset.
        text = io.TextIOWrapper(buffered, encoding="utf-8", errors="surrogateescape", newline="")
        try:
            yield _named_failures(source, raw, text, rewind)
        finally:
            text.close()  # not raw: LimitedReader leaves the stream it reads open


def _named_failures(
    source: object, raw: BinaryIO, text: io.TextIOWrapper, rewind: bool
) -> Iterator[str]:
    """The lines, an OSError while reading them (only then) as an InvalidField."""
    try:
        if rewind:
            raw.seek(0)
        yield from utf8_lines(text)
    except OSError as exc:
        raise InvalidField("file", source_name(source), f"cannot be read: {exc}") from exc


def too_large(size: int, limit: int) -> InvalidField:
    return InvalidField(
        "file", size, f"larger than {limit} bytes; split the file or raise the limit"
    )


def source_name(source: object) -> str:
    if isinstance(source, str | os.PathLike):
        return str(os.fspath(source))
    return str(getattr(source, "name", "<stream>"))


def utf8_lines(text: Iterable[str]) -> Iterator[str]:
    """The physical lines of ``text``, a BOM dropped; an undecodable byte stops with its offset.

    ``text`` was decoded with ``surrogateescape``, so every invalid byte shows up as a lone
    surrogate and encoding a line back gives exactly the bytes it came from.
    """
    offset = 0
    for number, line in enumerate(text, start=1):
        if line.isascii():
            offset += len(line)
            yield line
            continue
        try:
            size = len(line.encode("utf-8"))
        except UnicodeEncodeError as exc:
            at = offset + len(line[: exc.start].encode("utf-8", "surrogateescape"))
            bad = line[exc.start : exc.end].encode("utf-8", "surrogateescape")
            hint = " (it looks like UTF-16)" if at == 0 and bad[:1] in (b"\xff", b"\xfe") else ""
            raise InvalidField(
                "file",
                bad,
                f"not UTF-8{hint}: invalid byte 0x{bad[0]:02x} at byte {at} (0-based, line "
                f"{number}); save the file as UTF-8",
            ) from None
        offset += size
        yield line[1:] if number == 1 and line.startswith("\ufeff") else line
