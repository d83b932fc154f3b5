"""Relative links in README.md, CONTRIBUTING.md and docs/*.md point to files that exist and,
with a ``#fragment``, to a heading that exists there (GitHub's anchor rules)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")])

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.DOTALL | re.MULTILINE)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _prose(text: str) -> str:
    """The text without fenced blocks and inline code, where links are not links."""
    return _CODE.sub("", _FENCE.sub("", text))


def anchors(text: str) -> set[str]:
    """The heading anchors GitHub makes: lower case, punctuation dropped, spaces as "-",
    a repeated one suffixed -1, -2, ..."""
    seen: dict[str, int] = {}
    result: set[str] = set()
    for heading in _HEADING.findall(_FENCE.sub("", text)):
        plain = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", plain.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def _broken(page: Path) -> list[str]:
    problems = []
    for target in _LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            problems.append(f"{target}: no such file")
        elif (
            fragment
            and file.suffix == ".md"
            and fragment not in anchors(file.read_text(encoding="utf-8"))
        ):
            problems.append(f"{target}: no heading #{fragment} in {file.name}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    assert _broken(page) == []


def test_the_checker_finds_what_is_broken(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## Return-Path and VERP\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Top\n\n## Two words\n\n"
        "[ok](other.md#return-path-and-verp) [ok](#two-words) [web](https://x.invalid/#no)\n"
        "[gone](missing.md) [bad](other.md#no-such) [bad](#nowhere)\n"
        "`[code](missing.md)`\n```\n[fenced](missing.md)\n```\n"
    )
    assert _broken(page) == [
        "missing.md: no such file",
        "other.md#no-such: no heading #no-such in other.md",
        "#nowhere: no heading #nowhere in page.md",
    ]
