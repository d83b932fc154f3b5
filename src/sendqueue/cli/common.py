"""What every command group shares: the consoles, error handling, the container, JSON output,
the policy flags and signal handling."""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console

from sendqueue.bootstrap import Container, bootstrap, settle_heap
from sendqueue.domain.errors import (
    Conflict,
    IllegalTransition,
    InfrastructureError,
    InvalidField,
    InvalidInput,
    InvalidSettings,
    NoSendingDay,
    NotFound,
)
from sendqueue.domain.policy import (
    SendingPolicy,
    Window,
    load_timezone,
    parse_date,
    parse_start,
    parse_weekdays,
    parse_window,
)
from sendqueue.domain.wording import plural
from sendqueue.settings import Settings
from sendqueue.settings.file import config_file, load_settings

__all__ = [
    "JitterOpt",
    "JsonOpt",
    "PerDayOpt",
    "SeedOpt",
    "SkipOpt",
    "TimezoneOpt",
    "WeekdaysOpt",
    "WindowOpt",
    "build_policy",
    "container",
    "err",
    "fail",
    "given_config",
    "handle_errors",
    "help_width",
    "install_signals",
    "log",
    "out",
    "print_json",
    "settings",
    "use_config",
    "widen_help",
]

# Piped output is not squeezed into 80 columns: ids must stay whole for scripts and people.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)
log = logging.getLogger("sendqueue")

#: The narrowest ``--help`` that cuts no option name: ``campaign create`` needs 94 columns for
#: ``--unsubscribe-footer/--no-unsubscribe-footer`` beside its type and help
#: (tests/integration/test_cli_help.py renders every command's help at this width).
HELP_MIN_WIDTH = 100


def help_width(columns: int | None = None) -> int:
    """The width of ``--help``: the terminal's (``columns``, else stdout's size or $COLUMNS),
    160 when stdout is no terminal (piped, CI), never below :data:`HELP_MIN_WIDTH`: a narrower
    terminal wraps the lines rather than have Rich cut an option name to ``--unsubscribe-fo…``."""
    if columns is None:
        columns = shutil.get_terminal_size(fallback=(160, 24)).columns
    return max(columns, HELP_MIN_WIDTH)


def widen_help() -> None:
    """Have Typer draw ``--help`` (and its usage errors) :func:`help_width` columns wide
    through its TERMINAL_WIDTH variable, unless the user set it: Rich alone takes 80 columns
    when piped. The variable, not ``typer.rich_utils``: that module costs a quarter second to
    import, and Typer imports it only when it draws help."""
    os.environ.setdefault("TERMINAL_WIDTH", str(help_width()))


F = TypeVar("F", bound=Callable[..., Any])


def fail(code: int, message: str) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    err.print(f"error: {message}", markup=False, soft_wrap=True)
    raise typer.Exit(code)


def _print_invalid_input(exc: InvalidInput) -> None:
    err.print(f"error: {exc.summary}: {plural(exc.total, 'problem')}", markup=False)
    for problem in exc.errors:
        where = f"row {problem.row}: " if problem.row is not None else ""
        value = problem.value
        # the value as given, when it is short enough to read in one line (a zone, an address)
        got = f" (got {value!r})" if isinstance(value, str) and 0 < len(value) <= 80 else ""
        err.print(f"  {where}{problem.field}: {problem.reason}{got}", markup=False, soft_wrap=True)
    if exc.total > len(exc.errors):
        err.print(f"  ... and {exc.total - len(exc.errors)} more", markup=False)


def handle_errors(func: F) -> F:
    """Map domain and infrastructure errors to one clear line and an exit status."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except InvalidInput as exc:
            _print_invalid_input(exc)
            raise typer.Exit(2) from None
        except InvalidField as exc:
            fail(2, str(exc))
        except InvalidSettings as exc:  # each sentence names its variable
            for problem in exc.problems:
                err.print(f"error: {problem}", markup=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except NoSendingDay as exc:
            fail(2, f"policy: {exc}")
        except (NotFound, IllegalTransition, Conflict) as exc:
            fail(1, str(exc))
        except InfrastructureError as exc:
            fail(3, f"{type(exc).__name__}: {exc}")

    return wrapper  # type: ignore[return-value]


#: ``--config`` (or ``SENDQUEUE_CONFIG``) of the invocation running; set by the root's callback.
_given_config: ContextVar[str | None] = ContextVar("sendqueue_config", default=None)


def use_config(ctx: typer.Context, config: str | None) -> None:
    """Remember ``config`` for the commands of this invocation (forgotten when it ends)."""
    token = _given_config.set(config)
    ctx.call_on_close(lambda: _given_config.reset(token))


def given_config() -> str | None:
    """``--config`` (or ``SENDQUEUE_CONFIG``) of this invocation; None when not given."""
    return _given_config.get()


def settings() -> Settings:
    """This command's settings: the environment over the settings file
    (:mod:`sendqueue.settings.file`); a refused value exits 2 naming its variable."""
    try:
        path = config_file(given_config())
    except InvalidField as exc:
        fail(2, f"{exc.field}: {exc.reason} (got {exc.value!r})")
    return load_settings(path)  # InvalidSettings: handle_errors prints each sentence


@contextmanager
def container(given: Settings | None = None) -> Iterator[Container]:
    """The container built from this command's settings (or ``given``), closed on the way
    out."""
    built = bootstrap(given if given is not None else settings())
    settle_heap()
    try:
        yield built
    finally:
        built.close()


def print_json(data: Any) -> None:
    """``--json`` output: indented, UTF-8 as is."""
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


# -- shared policy flags ----------------------------------------------------------------------
TimezoneOpt = Annotated[
    str | None,
    typer.Option("--timezone", help="IANA timezone [default: SENDQUEUE_DEFAULT_TIMEZONE]"),
]
PerDayOpt = Annotated[int, typer.Option("--per-day", help="Emails per local day (1..10000).")]
WeekdaysOpt = Annotated[
    str, typer.Option("--weekdays", help="Sending days: mon,tue,... or ranges like mon-fri.")
]
WindowOpt = Annotated[
    list[str] | None,
    typer.Option("--window", help="Daily window HH:MM-HH:MM (repeatable) [default: 09:00-17:00]"),
]
SkipOpt = Annotated[
    list[str] | None, typer.Option("--skip-date", help="A date to skip, YYYY-MM-DD (repeatable).")
]
JitterOpt = Annotated[int, typer.Option("--jitter", help="Random shift of each send, seconds.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed that makes jitter repeatable.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def build_policy(
    *,
    timezone: str | None,
    per_day: int,
    weekdays: str,
    windows: list[str] | None,
    start: str | None,
    skip_dates: list[str] | None,
    jitter: int,
    seed: int,
    default_timezone: str,
) -> SendingPolicy:
    """A policy from the textual flags; every problem names its flag's field."""
    zone = timezone or default_timezone
    load_timezone(zone)
    return SendingPolicy(
        timezone=zone,
        per_day=per_day,
        weekdays=parse_weekdays(weekdays),
        windows=tuple(parse_window(w) for w in windows) if windows else (Window(540, 1020),),
        start=parse_start(start, zone) if start else None,
        skip_dates=frozenset(parse_date(d) for d in skip_dates or []),
        jitter_seconds=jitter,
        seed=seed,
    )


def install_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set ``stop``: in-flight sends finish, then the process stops."""

    def handler(signum: int, _frame: object) -> None:
        log.warning(
            "received %s: finishing in-flight sends, then stopping", signal.Signals(signum).name
        )
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
