"""Times as the pages show them (sendqueue.web.times): the zone's abbreviation at that instant,
and the table of abbreviations by offset that common.js reads to write the same text."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from sendqueue.web.times import human_time, zone_names, zone_names_json, zone_time

WINTER = datetime(2026, 12, 4, 8, 30, 12, 345678, tzinfo=UTC)
SUMMER = datetime(2026, 7, 4, 7, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "zone", "text"),
    [
        (WINTER, "Europe/Berlin", "2026-12-04 09:30 CET"),
        (SUMMER, "Europe/Berlin", "2026-07-04 09:30 CEST"),
        (WINTER, "America/New_York", "2026-12-04 03:30 EST"),
        (WINTER, "UTC", "2026-12-04 08:30 UTC"),
        (WINTER, "Asia/Kolkata", "2026-12-04 14:00 IST"),
        (WINTER, "America/Sao_Paulo", "2026-12-04 05:30 -03"),  # tzdata has no letters for it
        (WINTER, ZoneInfo("Asia/Tokyo"), "2026-12-04 17:30 JST"),
        (None, "Europe/Berlin", ""),
    ],
)
def test_human_time_names_the_zone_and_drops_the_microseconds(
    value: datetime | None, zone: str, text: str
) -> None:
    assert human_time(value, zone) == text


def test_human_time_with_seconds() -> None:
    assert human_time(WINTER, "Europe/Berlin", seconds=True) == "2026-12-04 09:30:12 CET"


def test_zone_time_names_the_recipients_zone() -> None:
    assert zone_time(WINTER, "Asia/Tokyo") == "2026-12-04 17:30 Asia/Tokyo"
    assert zone_time(None, "Asia/Tokyo") == ""


def test_zone_names_holds_every_abbreviation_by_offset() -> None:
    names = zone_names(["Europe/Berlin", "Asia/Tokyo", "UTC", "Nowhere/Atlantis", ""], now=WINTER)
    assert names == {
        "Asia/Tokyo": {"540": "JST"},
        "Europe/Berlin": {"60": "CET", "120": "CEST"},
        "UTC": {"0": "UTC"},
    }
    assert zone_names_json(["Europe/Berlin"], now=WINTER) == (
        '{"Europe/Berlin":{"120":"CEST","60":"CET"}}'
    )


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe"])
def test_the_table_gives_what_human_time_writes(zone: str) -> None:
    """What common.js writes (the table's name for the instant's offset) is what the server
    writes, on every day of a year."""
    table = zone_names([zone], now=WINTER)[zone]
    start = datetime(2026, 1, 1, 12, tzinfo=UTC).timestamp()
    for day in range(365):
        at = datetime.fromtimestamp(start + day * 86400, UTC)
        local = at.astimezone(ZoneInfo(zone))
        offset = local.utcoffset()
        assert offset is not None
        name = table[str(int(offset.total_seconds() // 60))]
        assert human_time(at, zone).endswith(f" {name}"), (at, zone)
