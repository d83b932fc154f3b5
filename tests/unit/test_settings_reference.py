"""docs/settings.md is what sendqueue.settings.reference renders from the Settings class."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest

from sendqueue.settings import Settings
from sendqueue.settings import reference as settings_reference

PAGE = Path(__file__).resolve().parents[2] / settings_reference.PAGE


def test_docs_settings_md_is_the_rendered_page() -> None:
    rendered = settings_reference.render()
    stored = PAGE.read_text(encoding="utf-8")
    if stored != rendered:
        diff = "".join(
            list(
                difflib.unified_diff(
                    stored.splitlines(keepends=True),
                    rendered.splitlines(keepends=True),
                    "docs/settings.md",
                    "rendered",
                )
            )[:40]
        )
        pytest.fail(
            "docs/settings.md differs from the Settings class; regenerate it from the "
            f"repository root with:\n    {settings_reference.COMMAND}\n{diff}",
            pytrace=False,
        )


def test_every_setting_has_exactly_one_row() -> None:
    page = settings_reference.render()
    rows = re.findall(r"^\| `(SENDQUEUE_[A-Z0-9_]+)` \|", page, flags=re.MULTILINE)
    expected = [f"SENDQUEUE_{name.upper()}" for name in Settings.model_fields]
    assert sorted(rows) == sorted(expected)


def test_a_setting_no_group_names_lands_in_other() -> None:
    sections = settings_reference._grouped(["mailer", "brand_new_knob", "feedback_whatever"])
    titles = {group.title: names for group, names in sections}
    assert titles["Other settings"] == ["brand_new_knob"]
    assert titles["Unsubscribe links, bounces and feedback"] == ["feedback_whatever"]
    assert titles["Where it runs"] == ["mailer"]


def test_rows_show_defaults_choices_and_bounds() -> None:
    page = settings_reference.render()
    row = {
        match.group(1): match.group(0)
        for match in re.finditer(r"^\| `(SENDQUEUE_[A-Z0-9_]+)` \|.*$", page, flags=re.MULTILINE)
    }
    assert row["SENDQUEUE_MAX_ATTEMPTS"].startswith("| `SENDQUEUE_MAX_ATTEMPTS` | `3` |")
    assert row["SENDQUEUE_MAX_ATTEMPTS"].endswith("; 1 to 20 |")
    assert "one of `retry`, `fail`" in row["SENDQUEUE_STALE_POLICY"]
    assert "| unset |" in row["SENDQUEUE_API_TOKEN"]
    assert "| `true` |" in row["SENDQUEUE_SPACE_LATE_SENDS"]
    # a pipe inside a description does not split the table's cell
    assert "starttls\\|tls\\|none" in row["SENDQUEUE_MAILER"]
