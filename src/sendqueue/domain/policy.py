"""The sending policy of a campaign: when, how many, and in which timezone.

A policy is a value: frozen, validated on construction, and stored as JSON. Every invalid field
raises :class:`~sendqueue.domain.errors.InvalidField` naming the field, the value and what is
allowed. The ``parse_*`` helpers turn the textual forms the CLI, the API and the CSV headers use
into the typed values.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import InvalidField
from .wording import plural

__all__ = [
    "DEFAULT_WEEKDAYS",
    "DEFAULT_WINDOWS",
    "MAX_JITTER_SECONDS",
    "MAX_PER_DAY",
    "WEEKDAY_NAMES",
    "SendingPolicy",
    "Window",
    "load_timezone",
    "parse_date",
    "parse_start",
    "parse_weekdays",
    "parse_window",
]

MAX_PER_DAY = 10_000
MAX_JITTER_SECONDS = 86_400
WEEKDAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_WEEKDAY_FULL = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WEEKDAY_TITLES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_HHMM = re.compile(r"^(\d{1,2}):(\d{2})$")


def load_timezone(name: str, field_name: str = "timezone") -> ZoneInfo:
    """The IANA zone ``name`` or :class:`InvalidField` (``tzdata`` ships the database)."""
    if not isinstance(name, str) or not name or name != name.strip():
        raise InvalidField(field_name, name, "expected an IANA timezone such as Europe/Berlin")
    try:
        return ZoneInfo(name)
    # OSError: a key naming a directory of the database ("Europe"), or too long for a file name
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise InvalidField(
            field_name, name, "unknown IANA timezone; use a name such as Europe/Berlin or UTC"
        ) from exc


def _parse_hhmm(text: str, field_name: str, *, allow_24: bool) -> int:
    m = _HHMM.match(text.strip())
    if not m:
        raise InvalidField(field_name, text, "expected a time as HH:MM, e.g. 09:00")
    hours, minutes = int(m.group(1)), int(m.group(2))
    if minutes > 59 or hours > 24 or (hours == 24 and (minutes or not allow_24)):
        raise InvalidField(
            field_name, text, "not a valid time of day (00:00 to 23:59, or 24:00 as an end)"
        )
    return hours * 60 + minutes


def _fmt_minutes(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


@dataclass(frozen=True, order=True)
class Window:
    """A daily wall-clock window ``[start, end)`` in minutes after local midnight (0..1440)."""

    start_minute: int
    end_minute: int

    def __post_init__(self) -> None:
        if not (0 <= self.start_minute < 1440 and 0 < self.end_minute <= 1440):
            raise InvalidField("windows", str(self), "times must lie between 00:00 and 24:00")
        if self.end_minute <= self.start_minute:
            raise InvalidField(
                "windows",
                str(self),
                "a window must end after it starts on the same day; for one that crosses "
                f"midnight use two windows, e.g. {_fmt_minutes(self.start_minute)}-24:00 and "
                f"00:00-{_fmt_minutes(self.end_minute)}",
            )

    @property
    def minutes(self) -> int:
        """Length of the window in minutes."""
        return self.end_minute - self.start_minute

    def __str__(self) -> str:
        return f"{_fmt_minutes(self.start_minute)}-{_fmt_minutes(self.end_minute)}"


def parse_window(text: str) -> Window:
    """``"09:00-17:00"`` -> :class:`Window`. ``24:00`` is allowed as an end."""
    if not isinstance(text, str) or text.count("-") != 1:
        raise InvalidField("windows", text, "expected HH:MM-HH:MM, e.g. 09:00-17:00")
    left, right = text.split("-")
    start = _parse_hhmm(left, "windows", allow_24=False)
    end = _parse_hhmm(right, "windows", allow_24=True)
    if end <= start:
        raise InvalidField(
            "windows",
            text,
            "a window must end after it starts on the same day; for one that crosses midnight "
            f"use two windows, e.g. {left.strip()}-24:00 and 00:00-{right.strip()}",
        )
    return Window(start, end)


def parse_weekdays(text: str | Iterable[str]) -> frozenset[int]:
    """``"mon-fri"``, ``"mon,wed,fri"`` or ``"sat-mon"`` -> weekday numbers (Monday is 0)."""
    if not isinstance(text, str | Iterable):
        # JSON gives numbers and booleans too; iterating one would raise TypeError
        raise InvalidField("weekdays", text, "expected text such as mon-fri, or a list of days")
    parts = (
        [p for p in text.replace(" ", "").lower().split(",") if p]
        if isinstance(text, str)
        else [str(p).strip().lower() for p in text]
    )
    if not parts:
        raise InvalidField("weekdays", text, "name at least one day, e.g. mon-fri or mon,wed")
    days: set[int] = set()

    def day(name: str) -> int:
        for number, full in enumerate(_WEEKDAY_FULL):
            if len(name) >= 3 and full.startswith(name):
                return number
        raise InvalidField(
            "weekdays", name, "unknown day; use mon, tue, wed, thu, fri, sat, sun or a range"
        )

    for part in parts:
        if "-" in part:
            a, _, b = part.partition("-")
            first, last = day(a), day(b)
            i = first
            while True:
                days.add(i)
                if i == last:
                    break
                i = (i + 1) % 7
        else:
            days.add(day(part))
    return frozenset(days)


def parse_date(text: str, field_name: str = "skip_dates") -> date:
    """``"2026-12-24"`` -> :class:`date`."""
    try:
        return date.fromisoformat(text.strip())
    except (ValueError, AttributeError) as exc:
        raise InvalidField(field_name, text, "expected a date as YYYY-MM-DD") from exc


def parse_start(text: str, timezone: str) -> datetime:
    """An ISO-8601 instant. Without an offset it is wall-clock time in ``timezone``."""
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except (ValueError, AttributeError) as exc:
        raise InvalidField(
            "start", text, "expected an ISO-8601 time, e.g. 2026-12-01T09:00 or ...T08:00Z"
        ) from exc
    if value.tzinfo is None:
        value = value.replace(tzinfo=load_timezone(timezone))
    return value


DEFAULT_WEEKDAYS: frozenset[int] = frozenset(range(5))
DEFAULT_WINDOWS: tuple[Window, ...] = (Window(9 * 60, 17 * 60),)


def _weekday_text(days: frozenset[int]) -> str:
    ordered = sorted(days)
    if len(ordered) == 7:
        return "every day"
    runs: list[tuple[int, int]] = []
    for d in ordered:
        if runs and runs[-1][1] == d - 1:
            runs[-1] = (runs[-1][0], d)
        else:
            runs.append((d, d))
    parts = []
    for a, b in runs:
        if a == b:
            parts.append(_WEEKDAY_TITLES[a])
        elif b == a + 1:
            parts.append(f"{_WEEKDAY_TITLES[a]}, {_WEEKDAY_TITLES[b]}")
        else:
            parts.append(f"{_WEEKDAY_TITLES[a]}\u2013{_WEEKDAY_TITLES[b]}")
    return ", ".join(parts)


@dataclass(frozen=True)
class SendingPolicy:
    """When a campaign may send, and how much.

    ``start`` is an aware instant (a naive one is taken as wall-clock time in ``timezone``);
    ``None`` means "as soon as the campaign is provisioned". ``weekdays`` uses Monday = 0.
    ``jitter_seconds`` moves each send by a deterministic amount (given ``seed``) without ever
    leaving its window or passing the next send.
    """

    timezone: str = "Europe/Berlin"
    per_day: int = 20
    weekdays: frozenset[int] = DEFAULT_WEEKDAYS
    windows: tuple[Window, ...] = DEFAULT_WINDOWS
    start: datetime | None = None
    skip_dates: frozenset[date] = field(default_factory=frozenset)
    jitter_seconds: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        zone = load_timezone(self.timezone)
        if isinstance(self.per_day, bool) or not isinstance(self.per_day, int):
            raise InvalidField("per_day", self.per_day, f"expected a whole number 1..{MAX_PER_DAY}")
        if not 1 <= self.per_day <= MAX_PER_DAY:
            raise InvalidField("per_day", self.per_day, f"must be between 1 and {MAX_PER_DAY}")
        if isinstance(self.weekdays, str | bytes) or not isinstance(self.weekdays, Iterable):
            # a string would become a set of characters; parse_weekdays reads the text forms
            raise InvalidField(
                "weekdays",
                self.weekdays,
                "expected day numbers 0 (Monday) to 6; see parse_weekdays",
            )
        days = frozenset(self.weekdays)
        if not days:
            raise InvalidField("weekdays", "", "name at least one day, e.g. mon-fri")
        for day in days:
            # bool is an int subclass: True would pass for Tuesday
            if isinstance(day, bool) or not isinstance(day, int) or not 0 <= day <= 6:
                raise InvalidField("weekdays", day, "days are numbered 0 (Monday) to 6")
        object.__setattr__(self, "weekdays", days)
        if isinstance(self.windows, str | bytes) or not isinstance(self.windows, Iterable):
            raise InvalidField("windows", self.windows, "expected Window values; see parse_window")
        raw_windows = tuple(self.windows)
        for window in raw_windows:
            if not isinstance(window, Window):
                raise InvalidField(
                    "windows", window, "expected Window values; parse HH:MM-HH:MM with parse_window"
                )
        windows = tuple(sorted(raw_windows))
        if not windows:
            raise InvalidField("windows", "", "give at least one window, e.g. 09:00-17:00")
        for a, b in itertools.pairwise(windows):
            if b.start_minute < a.end_minute:
                raise InvalidField(
                    "windows", f"{a}, {b}", "windows must not overlap; merge or separate them"
                )
        object.__setattr__(self, "windows", windows)
        if isinstance(self.skip_dates, str | bytes) or not isinstance(self.skip_dates, Iterable):
            # frozenset("2026-12-24") would silently become a set of characters
            raise InvalidField("skip_dates", self.skip_dates, "expected a collection of dates")
        skip_dates = frozenset(self.skip_dates)
        for skip in skip_dates:
            # a datetime is a date subclass but never equals one, so it would never match
            if not isinstance(skip, date) or isinstance(skip, datetime):
                raise InvalidField("skip_dates", skip, "expected dates (YYYY-MM-DD), not times")
        object.__setattr__(self, "skip_dates", skip_dates)
        if isinstance(self.jitter_seconds, bool) or not isinstance(self.jitter_seconds, int):
            raise InvalidField("jitter_seconds", self.jitter_seconds, "expected whole seconds")
        if not 0 <= self.jitter_seconds <= MAX_JITTER_SECONDS:
            raise InvalidField(
                "jitter_seconds", self.jitter_seconds, f"must be between 0 and {MAX_JITTER_SECONDS}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise InvalidField("seed", self.seed, "expected a whole number")
        if self.start is not None:
            if not isinstance(self.start, datetime):
                raise InvalidField("start", self.start, "expected a date and time")
            if self.start.tzinfo is None or self.start.utcoffset() is None:
                object.__setattr__(self, "start", self.start.replace(tzinfo=zone))
            try:
                # 9999-12-31T23:00-05:00 is a valid datetime whose instant is not
                self.start.astimezone(UTC).astimezone(zone)
            except OverflowError as exc:
                raise InvalidField(
                    "start",
                    self.start.isoformat(),
                    "outside the supported range: the instant, in UTC and in the policy's "
                    "timezone, must lie in the years 1 to 9999",
                ) from exc

    @property
    def zone(self) -> ZoneInfo:
        """The policy's timezone as a :class:`ZoneInfo`."""
        return ZoneInfo(self.timezone)

    @property
    def window_minutes(self) -> int:
        """Total sending minutes per allowed day."""
        return sum(w.minutes for w in self.windows)

    def describe(self, *, local_time: bool = False) -> str:
        """The policy in words: ``20 a day, Mon-Fri, 09:00-17:00, UTC`` (with en dashes).

        With ``local_time`` (a campaign that reads its windows in each recipient's zone) the
        zone part says so: ``09:00-17:00 in each recipient's local time (UTC where unknown;
        days counted in UTC)``."""
        windows = " and ".join(str(w).replace("-", "\u2013") for w in self.windows)
        days = _weekday_text(self.weekdays)
        zone = self.timezone
        if local_time:
            where = (
                f" in each recipient's local time ({zone} where unknown; days counted in {zone})"
            )
            text = f"{self.per_day} a day, {days}, {windows}{where}"
        else:
            text = f"{self.per_day} a day, {days}, {windows}, {zone}"
        if self.skip_dates:
            text += f", skipping {plural(len(self.skip_dates), 'date')}"
        if self.jitter_seconds:
            text += f", jitter \u00b1{self.jitter_seconds}s"
        return text

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form; :meth:`from_dict` reads it back."""
        return {
            "timezone": self.timezone,
            "per_day": self.per_day,
            "weekdays": [WEEKDAY_NAMES[d] for d in sorted(self.weekdays)],
            "windows": [str(w) for w in self.windows],
            "start": self.start.isoformat() if self.start else None,
            "skip_dates": sorted(d.isoformat() for d in self.skip_dates),
            "jitter_seconds": self.jitter_seconds,
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SendingPolicy:
        """Build a policy from its JSON form (also accepts the CLI's textual forms)."""
        known = {
            "timezone", "per_day", "weekdays", "windows", "start", "skip_dates",
            "jitter_seconds", "seed",
        }  # fmt: skip
        unknown = set(data) - known
        if unknown:
            name = sorted(unknown)[0]
            raise InvalidField(name, data[name], f"unknown policy field; known: {sorted(known)}")
        tz = data.get("timezone") or "Europe/Berlin"
        kwargs: dict[str, Any] = {"timezone": tz}
        if data.get("per_day") is not None:
            kwargs["per_day"] = data["per_day"]
        if data.get("weekdays") is not None:
            kwargs["weekdays"] = parse_weekdays(data["weekdays"])
        if data.get("windows") is not None:
            kwargs["windows"] = tuple(parse_window(w) for w in _listed(data, "windows"))
        if data.get("start"):
            start = data["start"]
            kwargs["start"] = start if isinstance(start, datetime) else parse_start(str(start), tz)
        if data.get("skip_dates"):
            kwargs["skip_dates"] = frozenset(
                d if isinstance(d, date) else parse_date(str(d))
                for d in _listed(data, "skip_dates")
            )
        if data.get("jitter_seconds") is not None:
            kwargs["jitter_seconds"] = data["jitter_seconds"]
        if data.get("seed") is not None:
            kwargs["seed"] = data["seed"]
        return cls(**kwargs)


def _listed(data: Mapping[str, Any], name: str) -> list[Any]:
    """A list field of :meth:`SendingPolicy.from_dict`: a list, or text with commas (the form
    and CLI spelling). Anything else (a number, a boolean, an object) names the field."""
    raw = data[name]
    if isinstance(raw, str):
        return [part.strip() for part in raw.split(",") if part.strip()]
    if isinstance(raw, Mapping) or not isinstance(raw, Iterable):
        raise InvalidField(name, raw, "expected a list of values, or text with commas")
    return list(raw)
