"""The settings file: which one a command reads, and how ``sendqueue init`` writes one.

Every command reads its settings from the environment over one file (a variable set in the
environment wins over the same one in the file):

- the file named by ``--config PATH`` or ``SENDQUEUE_CONFIG`` (a missing one is an error);
- else ``./sendqueue.env``, when it exists (what ``sendqueue init`` writes);
- else ``./.env``, when it exists (read before there was a settings file, and still);
- else the environment alone.

The file is dotenv, read by python-dotenv as pydantic-settings does: ``NAME='value'`` lines
and ``#`` comments. ``init`` writes every value single-quoted (only ``\\`` and ``'`` are
escaped there) and refuses a value with a line break or ``${`` (python-dotenv would expand
it); the file is created with mode 0600, as it holds the secret key, the API token and the
mail passwords.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from dotenv import dotenv_values
from pydantic import ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from sendqueue.domain.errors import InvalidField

from . import Settings
from .errors import load_settings as checked_settings

__all__ = [
    "DEFAULT_CONFIG",
    "FALLBACK_CONFIG",
    "check_settings",
    "config_file",
    "install_config",
    "load_settings",
    "read_config",
    "render_config",
    "staged_config",
]

#: The settings file a command reads when none is named (and ``init`` writes).
DEFAULT_CONFIG = Path("sendqueue.env")
#: Read when there is no DEFAULT_CONFIG: the Settings class's own ``env_file``.
FALLBACK_CONFIG = Path(".env")
_PREFIX = "SENDQUEUE_"
_VARIABLE = re.compile(r"SENDQUEUE_[A-Z0-9_]+")


def config_file(given: str | Path | None) -> Path | None:
    """The file a command reads: ``given`` (``--config`` or ``SENDQUEUE_CONFIG``), which must
    exist, else the first of DEFAULT_CONFIG and FALLBACK_CONFIG that does; None for none."""
    if given is not None and str(given) != "":
        path = Path(given)
        if not path.is_file():
            reason = "is a directory" if path.is_dir() else "no such file"
            raise InvalidField("--config", str(given), f"{reason}; write one with `sendqueue init`")
        return path
    for path in (DEFAULT_CONFIG, FALLBACK_CONFIG):
        if path.is_file():
            return path
    return None


def read_config(path: Path) -> dict[str, str]:
    """The variables a settings file sets, as pydantic-settings reads them (python-dotenv)."""
    return {k: v for k, v in dotenv_values(path, encoding="utf-8").items() if v is not None}


def load_settings(path: Path | None) -> Settings:
    """The settings of ``path`` (None: no file) under the environment. Raises
    :class:`~sendqueue.domain.errors.InvalidSettings`, one sentence naming the variable per
    refused value."""
    return checked_settings(Settings, _env_file=path)


class _Given(Settings):
    """The settings of the values given alone: no environment, no file."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def field_of(variable: str) -> str:
    """``SENDQUEUE_PUBLIC_URL`` -> ``public_url``."""
    return variable.removeprefix(_PREFIX).lower()


def check_settings(values: Mapping[str, str]) -> None:
    """Raise InvalidField naming the variable (``SENDQUEUE_...``) of the first value the
    settings refuse, with their own rules and reasons; ``values`` alone, by variable name,
    without the environment or any file."""
    fields: dict[str, Any] = {field_of(name): value for name, value in values.items()}
    unknown = sorted(f for f in fields if f not in Settings.model_fields)
    if unknown:
        raise InvalidField(f"{_PREFIX}{unknown[0].upper()}", None, "no such setting")
    try:
        _Given(**fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        message = str(error["msg"]).removeprefix("Value error, ")
        loc = error["loc"]
        if loc:
            variable = f"{_PREFIX}{str(loc[0]).upper()}"
        else:  # a rule across variables names them in its message
            named = _VARIABLE.search(message)
            variable = named.group(0) if named else "settings"
        raise InvalidField(variable, None, message.removeprefix(f"{variable}: ")) from None


def _quoted(variable: str, value: str) -> str:
    """``value`` in single quotes, as python-dotenv reads it back unchanged."""
    if "\n" in value or "\r" in value or "\0" in value:
        raise InvalidField(variable, None, "a line break or NUL cannot be written to the file")
    if "${" in value:
        # python-dotenv expands ${NAME} even in single quotes; a URL can write $ as %24
        raise InvalidField(variable, None, "'${' cannot be written to the file (write $ as %24)")
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _comment(variable: str) -> str:
    description = Settings.model_fields[field_of(variable)].description or ""
    return "# " + " ".join(description.split())


def _default(variable: str) -> str:
    default = Settings.model_fields[field_of(variable)].default
    if default is None:
        return ""
    text = str(default).lower() if isinstance(default, bool) else str(default)
    return _quoted(variable, text)


def render_config(
    values: Mapping[str, str], optional: Sequence[str], *, header: Sequence[str] = ()
) -> str:
    """The file's text: ``header`` lines as comments, every value of ``values`` with its
    setting's description as a one-line comment above it, then each variable of ``optional``
    not in ``values`` commented out, with its default. Raises InvalidField naming the variable
    of a value that cannot be written."""
    lines = [f"# {line}".rstrip() for line in header]
    for variable, value in values.items():
        lines += ["", _comment(variable), f"{variable}={_quoted(variable, value)}"]
    rest = [v for v in optional if v not in values]
    if rest:
        lines += ["", "# -- optional: remove the leading '# ' of a line to set it " + "-" * 25]
        for variable in rest:
            lines += ["", _comment(variable), f"# {variable}={_default(variable)}"]
    return "\n".join(lines) + "\n"


def _write_private(path: Path, text: str, flags: int) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o600)
    try:
        os.fchmod(descriptor, 0o600)  # whatever the umask
        os.write(descriptor, text.encode())
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@contextmanager
def staged_config(path: Path, text: str) -> Iterator[Path]:
    """``text`` in a new private file (0600) next to ``path``, for reading back before it is
    installed; removed on the way out (unless installed)."""
    staged = path.with_name(f".{path.name}.{secrets.token_hex(4)}.new")
    _write_private(staged, text, os.O_EXCL)
    try:
        yield staged
    finally:
        with suppress(FileNotFoundError):
            staged.unlink()


def install_config(staged: Path, path: Path, *, force: bool) -> None:
    """Put the staged file at ``path``: atomically in place of an existing one with ``force``,
    else only when ``path`` does not exist (FileExistsError otherwise)."""
    if force:
        os.replace(staged, path)
        return
    _write_private(path, staged.read_text(), os.O_EXCL)
