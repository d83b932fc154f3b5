"""The date an out-of-office notice says its writer is back. Pure, no I/O.

:func:`return_date` reads the subject and text of an automatic answer in English or German and
gives the first day the writer is back, or None when no such date can be read. A date counts
only after a phrase that announces a return or an absence's end:

- English: "back on", "back in the office on", "returning", "return on", "until", "till",
  "through" / "thru", "from ... I will be back";
- German: "zurück am", "bis", "bis einschließlich", "ab ... wieder", "wieder da / erreichbar /
  im Büro ab".

The date itself may be ``2026-12-14``, ``14.12.2026``, ``14.12.26``, ``14.12.``, ``14/12/2026``
(day first; ``12/14/2026`` is read month first because no month 14 exists, and ``05/06/2026``,
which could be either, is not read), ``14 December (2026)``, ``14th of Dec``, ``December 14(th),
2026``, ``14. Dezember (2026)``, a weekday name before any of them being ignored. A date named
with "through", "bis einschließlich" or "inclusive" is the last day away: the return is the day
after. Without a year it is the next such day on or after the day the notice came. A day that
does not exist (31.02.), one before the notice came, or one more than :data:`MAX_AHEAD_DAYS`
after it gives None: it cannot be what the writer meant.
"""

from __future__ import annotations

import re
from datetime import date, timedelta

__all__ = ["MAX_AHEAD_DAYS", "return_date"]

#: The furthest ahead a return date is believed (a sabbatical, a long parental leave).
MAX_AHEAD_DAYS = 366
#: How far after its phrase a date is looked for (characters).
_REACH = 60

_MONTHS = {
    "jan": 1, "january": 1, "januar": 1, "jänner": 1, "jaenner": 1,
    "feb": 2, "february": 2, "februar": 2,
    "mar": 3, "march": 3, "mär": 3, "märz": 3, "maerz": 3, "marz": 3,
    "apr": 4, "april": 4,
    "may": 5, "mai": 5,
    "jun": 6, "june": 6, "juni": 6,
    "jul": 7, "july": 7, "juli": 7,
    "aug": 8, "august": 8,
    "sep": 9, "sept": 9, "september": 9,
    "oct": 10, "october": 10, "okt": 10, "oktober": 10,
    "nov": 11, "november": 11,
    "dec": 12, "december": 12, "dez": 12, "dezember": 12,
}  # fmt: skip
_MONTH = "(?P<mname>" + "|".join(sorted(map(re.escape, _MONTHS), key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>[0-3]?\d)"
_YEAR = r"(?P<year>\d{4})"
_WEEKDAY = (
    r"(?:(?:mon|tues?|wed(?:nes)?|thu(?:rs)?|fri|sat(?:ur)?|sun)(?:day)?\.?|montag|dienstag"
    r"|mittwoch|donnerstag|freitag|samstag|sonnabend|sonntag|mo|di|mi|do|fr|sa|so)\.?,?\s+"
)
_DATES = [
    re.compile(r"(?P<year>\d{4})-(?P<month>[01]?\d)-(?P<day>[0-3]?\d)\b"),
    re.compile(r"(?P<day>[0-3]?\d)\.\s?(?P<month>[01]?\d)\.(?:\s?(?P<year>\d{4}|\d{2})\b)?"),
    re.compile(r"(?P<a>[0-3]?\d)/(?P<b>[0-3]?\d)(?:/(?P<year>\d{4}|\d{2}))?\b"),
    re.compile(
        rf"{_DAY}(?:st|nd|rd|th|\.)?\s+(?:of\s+)?{_MONTH}(?:,?\s+{_YEAR}\b)?", re.IGNORECASE
    ),
    re.compile(rf"{_MONTH}\s+{_DAY}(?:st|nd|rd|th)?\b(?:,?\s+{_YEAR}\b)?", re.IGNORECASE),
]
# phrases after which a date is the first day back ...
_BACK = re.compile(
    r"\b(?:back|returning|return(?:s|ed)?|zurück|zurueck|until|till|til|bis|up\s+to)(?=\W)",
    re.IGNORECASE,
)
# ... when the date is followed by "back" / "wieder" ("ab dem 14.12. wieder im Büro")
_FROM = re.compile(r"\b(?:ab|am|from|as\s+of)(?=\W)", re.IGNORECASE)
_THEN_BACK = re.compile(r"[^.!?\n]{0,40}?\b(?:back|wieder|zurück|zurueck)\b", re.IGNORECASE)
# ... and after which it is the last day away
_THROUGH = re.compile(
    r"\b(?:through|thru|bis\s+einschlie(?:ß|ss)lich|bis\s+inkl\.?|up\s+to\s+and\s+including)"
    r"(?=\W)",
    re.IGNORECASE,
)
_INCLUSIVE_AFTER = re.compile(r"\s*\(?\s*(?:inclusive|einschlie(?:ß|ss)lich|inkl\.?)", re.I)
_LEAD = re.compile(
    r"\s*(?:(?:on|the|am|dem|den|zum|from|after|to\s+the\s+office|in\s+the\s+office|in\s+office"
    rf"|at\s+work|im\s+büro|im\s+buero|,)\s+)*(?:{_WEEKDAY})?",
    re.IGNORECASE,
)


def return_date(text: str, *, received: date) -> date | None:
    """The first day the writer of the out-of-office ``text`` (its subject and body) is back,
    or None (module docstring). ``received``: the day the notice came."""
    if not isinstance(text, str) or not isinstance(received, date):
        return None
    for end, kind in _phrases(text):
        found = _date_at(text, end, received)
        if found is None:
            continue
        day, span_end = found
        if kind == "from" and not _THEN_BACK.match(text, span_end):
            continue  # "from 1 December" starts the absence: not a return
        if kind == "through" or _INCLUSIVE_AFTER.match(text, span_end):
            day += timedelta(days=1)
        if received <= day <= received + timedelta(days=MAX_AHEAD_DAYS):
            return day
        return None  # the date read makes no sense as a return: believe none after it
    return None


def _phrases(text: str) -> list[tuple[int, str]]:
    """Where each announcing phrase ends, in text order, and its kind: "back" (the date is
    the first day back), "through" (the last day away), "from" (the first day back only when
    "back" or "wieder" follows the date)."""
    through = [(m.end(), "through") for m in _THROUGH.finditer(text)]
    covered = {m.start() for m in _THROUGH.finditer(text)}
    back = [(m.end(), "back") for m in _BACK.finditer(text) if m.start() not in covered]
    start = [(m.end(), "from") for m in _FROM.finditer(text)]
    return sorted(through + back + start)


def _date_at(text: str, start: int, received: date) -> tuple[date, int] | None:
    """The date that follows ``start`` (after "on", "the", a weekday), and where it ends; None
    when what follows is no date or a day that does not exist."""
    lead = _LEAD.match(text, start)
    at = lead.end() if lead else start
    window = text[: at + _REACH]
    for pattern in _DATES:
        match = pattern.match(window, at)
        if match is not None:
            day = _to_date(match.groupdict(), received)
            return (day, match.end()) if day is not None else None
    return None


def _to_date(parts: dict[str, str | None], received: date) -> date | None:
    if parts.get("a") is not None:
        a, b = int(parts["a"] or 0), int(parts["b"] or 0)
        if a > 12 >= b:
            day, month = a, b
        elif b > 12 >= a:
            day, month = b, a
        else:
            return None  # 05/06: the 5th of June or May the 6th, nothing tells
    else:
        day = int(parts["day"] or 0)
        name = parts.get("mname")
        month = _MONTHS[name.lower()] if name else int(parts.get("month") or 0)
    year_text = parts.get("year")
    try:
        if year_text is None:
            found = date(received.year, month, day)
            return found if found >= received else date(received.year + 1, month, day)
        year = int(year_text)
        return date(year + 2000 if year < 100 else year, month, day)
    except ValueError:
        return None  # the 31st of February, month 13
