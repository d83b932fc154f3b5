"""Times as the pages show them: ``2026-12-04 09:30 CET``, in a named zone, with its zone.

The abbreviation is the one tzdata gives (``CET``, ``CEST``, ``EST``; ``+03`` where a zone has
none). Browsers cannot produce these names (``Intl`` writes ``GMT+1`` or ``CET`` depending on
the locale), so each page carries :func:`zone_names` for the zones it shows: every
abbreviation of a zone by its UTC offset, read from the same tzdata. ``common.js``
(``sq.formatTime``) looks the offset up there, so a row the live stream redraws reads exactly
as the one the server rendered.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["human_time", "zone_names", "zone_names_json", "zone_time"]

# The span zone_names samples around now, a week apart: a year back (sent emails) and two
# ahead (planned ones). Every daylight-saving period lasts longer than a week.
_BACK_DAYS = 400
_AHEAD_DAYS = 800
_STEP = timedelta(days=7)


def _zone(zone: ZoneInfo | str) -> ZoneInfo:
    return zone if isinstance(zone, ZoneInfo) else ZoneInfo(zone)


def human_time(value: datetime | None, zone: ZoneInfo | str, *, seconds: bool = False) -> str:
    """``2026-12-04 09:30 CET``: ``value`` on the wall clock of ``zone`` with the zone's
    abbreviation at that instant ("" for None); ``seconds`` adds them (``09:30:12``)."""
    if value is None:
        return ""
    local = value.astimezone(_zone(zone))
    clock = "%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M"
    return f"{local.strftime(clock)} {local.tzname() or _offset_name(local)}"


def zone_time(value: datetime | None, zone: str) -> str:
    """``2026-12-05 01:30 Asia/Tokyo``: ``value`` on the wall clock of ``zone``, named by its
    IANA name (a recipient's own zone, as its CSV gave it); "" for None."""
    if value is None:
        return ""
    return f"{value.astimezone(ZoneInfo(zone)).strftime('%Y-%m-%d %H:%M')} {zone}"


def _offset_name(local: datetime) -> str:
    offset = local.utcoffset() or timedelta(0)
    minutes = int(offset.total_seconds() // 60)
    sign = "-" if minutes < 0 else "+"
    return f"UTC{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


@functools.lru_cache(maxsize=1024)
def _names_of(name: str, year: int) -> tuple[tuple[int, str], ...]:
    """The abbreviations of zone ``name`` by UTC offset in minutes, around ``year``."""
    zone = ZoneInfo(name)
    found: dict[int, str] = {}
    at = datetime(year, 1, 1, tzinfo=UTC) - timedelta(days=_BACK_DAYS)
    end = datetime(year, 1, 1, tzinfo=UTC) + timedelta(days=_AHEAD_DAYS)
    while at < end:
        local = at.astimezone(zone)
        offset = local.utcoffset() or timedelta(0)
        # the later name wins where an offset was renamed (rare; the recent name is current)
        found[int(offset.total_seconds() // 60)] = local.tzname() or _offset_name(local)
        at += _STEP
    return tuple(sorted(found.items()))


def zone_names(zones: Iterable[str], *, now: datetime | None = None) -> dict[str, dict[str, str]]:
    """``{"Europe/Berlin": {"60": "CET", "120": "CEST"}}``: each known zone of ``zones`` with
    its abbreviations by UTC offset in minutes (unknown names are left out)."""
    year = (now or datetime.now(UTC)).year
    out: dict[str, dict[str, str]] = {}
    for name in sorted(set(zones)):
        if not name or name in out:
            continue
        try:
            out[name] = {str(offset): abbr for offset, abbr in _names_of(name, year)}
        except (ZoneInfoNotFoundError, ValueError):
            continue
    return out


def zone_names_json(zones: Iterable[str], *, now: datetime | None = None) -> str:
    """:func:`zone_names` as compact JSON, for a page's ``data-zone-names``."""
    return json.dumps(zone_names(zones, now=now), separators=(",", ":"), sort_keys=True)
